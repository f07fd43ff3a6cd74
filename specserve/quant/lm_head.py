"""An int8 LM head for the requantizing weight modes (int8, int4) on the CPU.

Why: once the decoder's matrices are 4-bit, SmolLM2-135M's tied 49152 x 576 head is the largest
weight a decode step reads (56 MB in bf16 against 66 MB for all 30 layers in Q4_1); llama.cpp
reads it as Q8_0. Per-row int8 halves it: at one token `_weight_int8pack_mm` takes 0.41 ms here
against 0.89 ms for the packed bf16 GEMM. But that kernel is slow for many rows (7.2 ms against
2.8 ms at 32 rows), so from SMALL_M rows on the head runs the same integers through oneDNN's
packed bf16 GEMM (int8 values are exact in bf16) and scales afterwards. Both paths compute
sum(x * q) * scale with fp32 accumulation; they round the bf16 result at different points, a
difference of the same size as the one between bf16 GEMMs of different row counts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specserve.layers.linear import PackedLinear, can_pack
from specserve.quant.int8 import SCALE_DTYPE, quantize_int8

# Rows up to which the int8 kernel runs (measured on the Zen 5 of session 5: 1 vs 32 rows). On the
# Zen 4 of sessions 10-21 it is no faster at 1 row and slower from 2 on (docs/results/
# 2026-12-04-session21/int8_head_rows.txt); 8 keeps decoding and verifying up to K=7 on one path.
SMALL_M = 8


class Int8LMHead(nn.Module):
    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        q, scales = quantize_int8(weight)
        self.register_buffer("weight", q.contiguous())  # [vocab, hidden] int8
        self.register_buffer("scales", scales.to(SCALE_DTYPE))  # [vocab]
        on_cpu = q.device.type == "cpu"
        self._kernel = on_cpu and hasattr(torch, "_weight_int8pack_mm")
        # Where the int8 kernel takes few rows they never reach the packed copy: no few-rows
        # bf16 copy beside it then.
        self._packed = (PackedLinear(q.to(torch.bfloat16), None, few_rows_copy=not self._kernel)
                        if on_cpu and can_pack(torch.bfloat16) else None)

    @property
    def weight_nbytes(self) -> int:
        # The packed copy's own count: bf16 where bf16 GEMMs are native, an fp32 image (4 bytes
        # per weight) elsewhere (layers/linear.py).
        return self.weight.nbytes + self.scales.nbytes + (
            self._packed.weight_nbytes if self._packed is not None else 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, vocab] bf16
        x = x.to(SCALE_DTYPE).contiguous()
        if self._kernel and x.shape[0] <= SMALL_M:
            return torch._weight_int8pack_mm(x, self.weight, self.scales)
        if self._packed is not None:
            return self._packed(x) * self.scales
        return F.linear(x, self.weight.to(x.dtype)) * self.scales

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per row"
