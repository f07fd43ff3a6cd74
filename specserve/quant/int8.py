"""Weight-only int8: per-output-channel symmetric quantization.

Why: halves weight bytes vs bf16, and decode (1 token) on CPU is memory-bound, so the fused
``aten._weight_int8pack_mm`` kernel (int8 weights, bf16 activations) is ~2x faster than a bf16
``F.linear`` at batch 1. It loses above ~6 tokens (1 thread, 576 -> 1536: 8 tokens 97 vs 76 us,
32 tokens 368 vs 166 us), so it pays for decode, not for prefill or wide verification.

CPU kernel notes (torch 2.13, measured on Zen4):
* the op needs ``scales.dtype == x.dtype``; we store bf16 scales.
* with fp32 activations the op is pathologically slow (~20x slower than bf16 at 1 token, ~50x at
  32 tokens), so fp32 inputs are cast to bf16, multiplied, and cast back. fp32 callers therefore
  get bf16-precision activations (the weights are int8 anyway).
* whether the op has a CUDA kernel depends on the torch build (unverified here), so we ask the
  dispatcher at runtime; without a kernel we use ``F.linear`` on the int8 weight cast to the
  activation dtype and apply the scale to the output (cheaper than dequantizing the weight).
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F
from torch import nn

SCALE_DTYPE = torch.bfloat16


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (w_int8 [out, in] int8, scales [out] bf16), w ~= w_int8 * scales[:, None].

    The integers are computed against the bf16-rounded scale the kernel will actually use, so
    rounding the scale does not add a systematic per-row bias.
    """
    w = w.detach().float()
    amax = w.abs().amax(dim=1).clamp(min=1e-8)  # [out]
    scales = (amax / 127.0).to(SCALE_DTYPE)  # [out]
    q = torch.round(w / scales.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scales


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Reference dequantization -> fp32 [out, in]."""
    return q.float() * scales.float()[:, None]


def scaled_linear(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x @ (weight * scales[:, None]).T for integer or fp8 codes widened to x's dtype and
    per-row scales. In fp16 the scales go on the weight first: codes of up to 127 (int8) or
    448 (fp8) times fp16 activations overflow fp16's 65504 long before the true outputs do.
    Elsewhere they follow the product (no scaled copy of the weight at each call)."""
    if x.dtype == torch.float16:
        return F.linear(x, weight * scales[:, None])
    return F.linear(x, weight) * scales


@cache
def _has_kernel(op: str, device_type: str) -> bool:
    """Whether aten `op` has a kernel for `device_type` (CUDA int8pack is build-dependent)."""
    key = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS"}.get(device_type)
    if key is None:
        return False
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op, key)
    except Exception:  # private API: any failure means "don't use it"
        return False


class Int8Linear(nn.Module):
    """Drop-in replacement for ``nn.Linear`` holding int8 weights + per-row bf16 scales."""

    def __init__(
        self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None
    ):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight.contiguous())  # [out, in] int8
        self.register_buffer("scales", scales.contiguous())  # [out] bf16
        self.register_buffer("bias", None if bias is None else bias.detach().clone())  # [out]

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        q, s = quantize_int8(linear.weight)
        return cls(q, s, linear.bias)

    @property
    def weight_nbytes(self) -> int:
        """Bytes of weight storage (int8 values + scales; bias excluded, as for nn.Linear)."""
        return self.weight.nbytes + self.scales.nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [..., in] -> [..., out], same dtype as x
        if (self.bias is None and x.dim() == 2 and x.dtype == SCALE_DTYPE and x.is_cpu
                and x.is_contiguous()):  # the decode hot path, straight to the kernel
            return torch._weight_int8pack_mm(x, self.weight, self.scales)
        shape, dtype = x.shape, x.dtype
        x2 = x.reshape(-1, self.in_features)  # [tokens, in]
        # The packed kernel on the CPU only: on an H200 it took 1.2-4.3 ms at 32 rows where a
        # bf16 linear takes 26-35 µs (its time grows with the rows); widening the int8 weight
        # for F.linear below is slower than bf16 but flat in the rows.
        if x.is_cpu and _has_kernel("aten::_weight_int8pack_mm", "cpu") and dtype in (
            torch.bfloat16,
            torch.float32,
        ):
            # fp32 goes through bf16: the fp32 kernel is ~20-50x slower (see module docstring)
            y = torch.ops.aten._weight_int8pack_mm(x2.to(SCALE_DTYPE), self.weight, self.scales)
        else:
            y = scaled_linear(x2, self.weight.to(dtype), self.scales.to(dtype))
        y = y.to(dtype)
        if self.bias is not None:
            y = y + self.bias.to(dtype)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"
