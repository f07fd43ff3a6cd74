"""The decoder's elementwise work as a few fused ops: RMSNorm (with the residual add in front),
RoPE fused with the KV-cache write, and silu(gate) * up.

Each op runs the C++ kernel (csrc/fused_ops.cpp) for contiguous CPU bf16/fp32 tensors and
otherwise a PyTorch reference that rounds in the same places (Hugging Face's Llama modules, op by
op): the kernel only removes dispatch overhead, which at batch 1 was a third of the forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specserve.layers import paged_attention_ext
from specserve.layers.kv_cache import LayerKVCache
from specserve.layers.rotary import apply_rotary

_KERNEL_DTYPES = (torch.bfloat16, torch.float32)


def _kernel(x: torch.Tensor, w: torch.Tensor | None = None):
    """The extension module when x qualifies for the CPU kernels, else None (the kernels have
    no autograd: training takes the reference path)."""
    if x.device.type != "cpu" or x.dtype not in _KERNEL_DTYPES or not x.is_contiguous():
        return None
    if torch.is_grad_enabled() and (x.requires_grad or (w is not None and w.requires_grad)):
        return None
    if w is not None and w.dtype != x.dtype:
        return None
    return paged_attention_ext.module()


def rms_norm_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(dtype)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """[n, d] -> RMSNorm(x) * w."""
    ext = _kernel(x, w)
    if ext is not None and x.dim() == 2:
        return ext.rms_norm(x, w, eps)
    return rms_norm_ref(x, w, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Pre-norm block entry: residual = residual + x; returns (RMSNorm(residual) * w, residual).
    The kernel path updates x and residual in place (vLLM's fused_add_rms_norm), so callers must
    not reuse them."""
    ext = _kernel(x, w)
    if ext is not None and x.dim() == 2 and residual.is_contiguous():
        ext.add_rms_norm_(x, residual, w, eps)
        return x, residual
    residual = residual + x
    return rms_norm_ref(residual, w, eps), residual


def rope_write_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  slots: torch.Tensor, cache: LayerKVCache, num_heads: int) -> torch.Tensor:
    """qkv [n, (H + 2 KVH) * D], cos / sin [n, D]: rotate q and k, write k and v into the cache
    at `slots` (quantized as `LayerKVCache.write` does for an 8-bit pool), return q [n, H, D]."""
    ext = _kernel(qkv)
    if (ext is not None and slots.dtype == torch.long
            and (cache.quantized or cache.k.dtype == qkv.dtype)):
        return ext.rope_write_kv(qkv, cos, sin, slots, cache.k, cache.v, num_heads,
                                 cache.k_scale, cache.v_scale, cache.kernel_format)
    return rope_write_kv_ref(qkv, cos, sin, slots, cache, num_heads)


def rope_write_kv_ref(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      slots: torch.Tensor, cache: LayerKVCache, num_heads: int) -> torch.Tensor:
    n, kvh, d = qkv.shape[0], cache.k.shape[1], cache.k.shape[2]
    heads = qkv.view(n, num_heads + 2 * kvh, d)
    qk = apply_rotary(heads[:, : num_heads + kvh], cos.view(n, 1, d), sin.view(n, 1, d))
    q, k = qk.split([num_heads, kvh], dim=1)
    cache.write(slots, k, heads[:, num_heads + kvh:])
    return q


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[n, 2I] -> silu(gate) * up [n, I] (SwiGLU, Shazeer 2020)."""
    ext = _kernel(gate_up)
    if ext is not None and gate_up.dim() == 2:
        return ext.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
