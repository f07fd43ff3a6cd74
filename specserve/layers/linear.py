"""Linear layers with weights pre-packed for oneDNN (CPU).

`F.linear` on the CPU hands oneDNN a plain row-major weight and pays a layout conversion inside
every call; for the small-M matmuls of decoding that is a large share of the time. Packing each
weight once into oneDNN's blocked layout (what inductor's CPU weight freezing does) makes the
same GEMMs faster (measured in docs/performance.md).

bf16 weights are packed as bf16 where the CPU runs bf16 GEMMs natively. Elsewhere (AVX2-only
CPUs, specserve/hardware.py) a bf16 GEMM would take torch's slow generic path, so the layer packs
the exact fp32 image of its bf16 weight and rounds the output to bf16: the same products with
fp32 accumulation that a bf16 GEMM computes, at fp32 GEMM speed. Reading that image costs twice
the weight's bytes, which is what bounds decoding, so up to `small_rows()` rows (32) the layer
reads the bf16 weight itself with a kernel that widens it in registers (csrc/bf16_gemv.cpp): on
a 2-core Zen 3, 2.1-2.3x faster at 1-8 rows and 1.1-1.3x at 24-32. Such a layer holds both (3x
the bf16 bytes).

On a CPU with AMX tiles (Intel Xeon since Sapphire Rapids), up to `amx_rows()` rows of a bf16
layer run our AMX kernel (csrc/amx_linear.cpp) on a second copy of the weight in AMX's tile
order: it streams the weight once for all the rows, where oneDNN's packed GEMM reads it at
a fraction of the memory bandwidth at decode batch sizes (docs/performance.md, session 25).
oneDNN keeps the longer prefill chunks. `SPECSERVE_NO_AMX=1` turns the kernel off.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from specserve.hardware import cpu_can_pack_fp32, cpu_has_bf16_gemm
from specserve.layers import paged_attention_ext

_EMPTY = torch.empty(0)
# Resolved once: looking the op up through torch.ops costs more than a batch-1 call of it.
_LINEAR_POINTWISE = (torch.ops.mkldnn._linear_pointwise.default
                     if torch.backends.mkldnn.is_available() else None)


def can_pack(dtype: torch.dtype) -> bool:
    """Whether a linear layer with weights of this dtype gets a packed oneDNN weight here."""
    if dtype == torch.bfloat16:
        return cpu_has_bf16_gemm() or cpu_can_pack_fp32()
    return dtype == torch.float32 and cpu_can_pack_fp32()


def small_rows() -> int:
    """Rows up to which a bf16 layer without native bf16 GEMMs reads its bf16 weight (the small-
    row kernel); 0 when the kernel is not built with AVX2 + FMA here."""
    ext = paged_attention_ext.module()
    return ext.bf16_linear_max_rows() if ext is not None and ext.bf16_linear_vectorized() else 0


def amx_rows() -> int:
    """Rows up to which a bf16 layer runs the AMX kernel; 0 where the CPU, the build or the
    kernel (Linux grants the tile state per process) lacks AMX, or SPECSERVE_NO_AMX is set."""
    if os.environ.get("SPECSERVE_NO_AMX", "") not in ("", "0"):
        return 0
    ext = paged_attention_ext.module()
    return ext.amx_linear_max_rows() if ext is not None and ext.amx_linear_available() else 0


def amx_pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [N / 16, K / 32, 16, 16, 2]: tiles of 16 outputs x 32 inputs, pairs of inputs
    interleaved (AMX's bf16 operand order), each output block's tiles contiguous along K."""
    n, k = weight.shape
    return weight.contiguous().view(n // 16, 16, k // 32, 16, 2).permute(0, 2, 3, 1, 4).contiguous()


class PackedLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, batch_hint: int = 32,
                 amx: bool = False, few_rows_copy: bool = True):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.dtype = weight.dtype  # of the activations in and out
        # bf16 on a CPU without bf16 GEMMs: an fp32 GEMM on the weight's exact fp32 image, and
        # the bf16 weight itself for a few rows.
        self.upcast = weight.dtype == torch.bfloat16 and not cpu_has_bf16_gemm()
        packed_dtype = torch.float32 if self.upcast else weight.dtype
        w = weight.detach().to(packed_dtype)
        # An opaque oneDNN tensor; it serves any number of rows (batch_hint only tunes it).
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, batch_hint)
        self.bias = None if bias is None else bias.detach().to(packed_dtype)
        # few_rows_copy=False: the caller runs few rows elsewhere (the int8 LM head's kernel), so
        # the bf16 copy would be 2 bytes per weight held for nothing.
        self.small_rows = small_rows() if self.upcast and few_rows_copy else 0
        self.weight_bf16 = weight.detach().contiguous() if self.small_rows else _EMPTY
        self._bias_or_empty = _EMPTY if self.bias is None else self.bias
        # amx: this layer may hold the AMX kernel's copy (pack_linears asks for it; an int4
        # layer's bf16 twin, kept for memory's sake, does not).
        n, k = weight.shape
        self.amx_rows = (amx_rows() if amx and weight.dtype == torch.bfloat16 and not self.upcast
                         and n % 16 == 0 and k % 32 == 0 else 0)
        self.weight_amx = amx_pack_weight(weight.detach()) if self.amx_rows else _EMPTY
        self.weight_nbytes = w.nbytes + self.weight_bf16.nbytes + self.weight_amx.nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if not self.upcast:
            if x.dim() == 2 and 0 < x.shape[0] <= self.amx_rows:
                # the bias as the layer loop passes it (the packed dtype; the kernel widens it)
                return paged_attention_ext.module().amx_linear(x, self.weight_amx,
                                                               self._bias_or_empty)
            return _LINEAR_POINTWISE(x, self.packed, self.bias, "none", [], "")
        if x.dim() == 2 and 0 < x.shape[0] <= self.small_rows:  # small_rows is 0 without the ext
            return paged_attention_ext.module().bf16_linear(x.contiguous(), self.weight_bf16,
                                                            self._bias_or_empty)
        y = _LINEAR_POINTWISE(x.float(), self.packed, self.bias, "none", [], "")
        return y.to(self.dtype)


def _dense_weights(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, bias) of a plain linear, or of a quantized one that is exactly a bf16 linear
    (fp8 on the CPU keeps a bf16 image: `bf16_image()`); None otherwise."""
    if type(module) is nn.Linear:
        return module.weight, module.bias
    image = getattr(module, "bf16_image", None)
    return image() if image is not None else None


def pack_linears(model: nn.Module) -> int:
    """Swap every bf16 / fp32 linear (plain, or a quantized layer's bf16 image; int8 / int4
    ones are left alone) for a PackedLinear. Returns the bytes added: a tied LM head gets its own
    packed copy, and an fp32 image of a bf16 weight (kept beside it) is twice its bytes."""
    added = 0
    # The activations' dtype: fp8 keeps a bf16 image whatever the model's dtype, and a packed
    # bf16 layer takes bf16 inputs only (an fp32 model's fp8 layers cast for themselves).
    embedding = getattr(model, "embed_tokens", None)
    act_dtype = embedding.weight.dtype if embedding is not None else None
    for name, module in list(model.named_modules()):
        dense = _dense_weights(module)
        if dense is None or dense[0].device.type != "cpu" or not can_pack(dense[0].dtype):
            continue  # oneDNN packing is for the CPU
        if act_dtype is not None and dense[0].dtype != act_dtype:
            continue
        weight, bias = dense
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        tied = weight is getattr(getattr(model, "embed_tokens", None), "weight", None)
        packed = PackedLinear(weight, bias, amx=True)
        setattr(parent, child, packed)
        # The weight was counted before packing: when the module keeps it (small-row kernel)
        # or it is not tied (dropped), its bytes are not new. An AMX copy is new.
        kept = packed.weight_bf16.numel() > 0
        added += packed.weight_nbytes - (weight.nbytes if kept or not tied else 0)
    return added
