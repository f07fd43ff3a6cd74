"""Weight-only fp8 (e4m3fn) with per-output-channel fp32 scales.

Why fp8: on GPUs with fp8 tensor cores (sm >= 8.9) ``torch._scaled_mm`` runs fp8 x fp8 with
row-wise scales, halving weight bytes and doubling math throughput vs bf16. We quantize the
activations dynamically per token there (untested here: guarded by device capability and shape).

CPU: there is no fast fp8 path. Measured on Zen4, 1 thread, [576 -> 1536]:
  bf16 F.linear ~60 us (1 token) / ~160 us (32 tokens); fp8 -> bf16 ``.to()`` of the weight alone
  ~2.7 ms, a 256-entry lookup table ~0.45 ms, CPU ``_scaled_mm`` ~2.8-3.9 ms.
Any per-forward dequantization is therefore 3-40x slower than bf16. So by default (cpu_mode="bf16")
the CPU module dequantizes once at construction and keeps only the bf16 image of fp8 * scale
(fp8's 2^-4 relative rounding plus bf16's 2^-8), which the engine pre-packs for oneDNN like any
bf16 linear (``bf16_image``; unpacked it ran ~20% slower): speed equals bf16, numerics are
the fp8 weights', but memory is bf16's 2 bytes/weight -- on CPU fp8 only *emulates* the GPU's
accuracy and saves nothing. ``cpu_mode="fp8"`` keeps 1 byte/weight + fp32 scales and dequantizes
through the lookup table every forward (~9x slower than bf16 at 1 token, ~4x at 32): only for
when memory, not latency, is the constraint.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specserve.quant.int8 import scaled_linear

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (w_fp8 [out, in] e4m3fn, scales [out] fp32), w ~= w_fp8 * scales[:, None]."""
    w = w.detach().float()
    scales = w.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX  # [out]
    return (w / scales[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8), scales


def dequantize_fp8(w_fp8: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Reference dequantization -> fp32 [out, in]."""
    return w_fp8.float() * scales.float()[:, None]


def _fp8_to_bf16(w: torch.Tensor) -> torch.Tensor:
    """Exact e4m3fn -> bf16. On CPU a byte-indexed table is ~6x faster than ``.to()``."""
    if w.device.type != "cpu":
        return w.to(torch.bfloat16)
    lut = torch.arange(256, dtype=torch.uint8).view(FP8).to(torch.bfloat16)  # [256]
    idx = w.view(torch.uint8).reshape(-1).to(torch.int32)
    return lut.index_select(0, idx).reshape(w.shape)


def _scaled_mm_ok(x: torch.Tensor, w: torch.Tensor) -> bool:
    """fp8 tensor cores need CUDA sm >= 8.9 and K, N multiples of 16."""
    return (
        x.is_cuda
        and w.dtype == FP8
        and torch.cuda.get_device_capability(x.device) >= (8, 9)
        and x.shape[-1] % 16 == 0
        and w.shape[0] % 16 == 0
    )


class Fp8Linear(nn.Module):
    """``nn.Linear`` replacement with fp8 weights; see the module docstring for the CPU policy."""

    def __init__(
        self,
        weight: torch.Tensor,
        scales: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        cpu_mode: str = "bf16",
    ):
        super().__init__()
        if cpu_mode not in ("bf16", "fp8"):
            raise ValueError(f"cpu_mode must be 'bf16' or 'fp8', got {cpu_mode!r}")
        self.out_features, self.in_features = weight.shape
        scales = scales.float()  # [out]
        if weight.device.type == "cpu" and cpu_mode == "bf16":  # see module docstring
            weight, scales = (weight.float() * scales[:, None]).to(torch.bfloat16), None
        self.register_buffer("weight", weight.contiguous())  # [out, in] fp8, or bf16 image
        self.register_buffer("scales", scales)  # [out] fp32; None when folded into a bf16 image
        self.register_buffer("bias", None if bias is None else bias.detach().clone())  # [out]

    @classmethod
    def from_linear(cls, linear: nn.Linear, cpu_mode: str = "bf16") -> Fp8Linear:
        w, s = quantize_fp8(linear.weight)
        return cls(w, s, linear.bias, cpu_mode=cpu_mode)

    def bf16_image(self) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """(weight, bias) when this layer is exactly a bf16 linear (the CPU default), so that
        the engine can pre-pack it for oneDNN like any bf16 linear (layers/linear.py)."""
        if self.scales is None and self.weight.dtype == torch.bfloat16:
            return self.weight, self.bias
        return None

    @property
    def weight_nbytes(self) -> int:
        """Bytes actually held: fp8 weights + fp32 scales, or the 2 B/weight bf16 image."""
        return self.weight.nbytes + (0 if self.scales is None else self.scales.nbytes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [..., in] -> [..., out], same dtype as x
        shape, dtype = x.shape, x.dtype
        x2 = x.reshape(-1, self.in_features)  # [tokens, in]
        if self.scales is None:  # bf16 image, scales folded in: plain bf16 GEMM
            y = F.linear(x2.to(self.weight.dtype), self.weight)
        elif _scaled_mm_ok(x2, self.weight):
            xf = x2.float()
            sx = xf.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX  # [tokens, 1]
            x8 = (xf / sx).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
            y = torch._scaled_mm(
                x8,
                self.weight.t(),  # [in, out] column-major, as cuBLASLt wants
                scale_a=sx,
                scale_b=self.scales.view(1, -1),
                out_dtype=torch.bfloat16,
            )
        else:
            cdt = torch.bfloat16 if x.device.type == "cpu" else dtype  # fp32 CPU -> bf16 speed
            y = scaled_linear(x2.to(cdt), _fp8_to_bf16(self.weight).to(cdt),
                              self.scales.to(cdt))
        y = y.to(dtype)
        if self.bias is not None:
            y = y + self.bias.to(dtype)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"fp8 e4m3 (stored {self.weight.dtype})"
        )
