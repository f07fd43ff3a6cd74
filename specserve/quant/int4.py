"""Weight-only int4: group-wise asymmetric quantization on torch's int4pack kernels.

Why: a quarter of bf16's weight bytes, and a fused kernel that never materializes the weight:
~2x faster than bf16 ``F.linear`` at 1 token on CPU, but slower from ~6 tokens on (32 tokens:
329 vs 166 us, 1 thread, 576 -> 1536) -- a decode-only win.

Kernel contract (torch 2.13, read from _meta_registrations.py and checked empirically):
* dequant is ``w = (q - 8) * scale + zero`` per group of ``group_size`` input columns, q in 0..15.
* ``scales_and_zeros`` is ``[in / group_size, out, 2]`` (``[..., 0]`` scale, ``[..., 1]`` zero)
  and must have the activation's dtype.
* CPU: ``_convert_weight_to_int4pack_for_cpu(q int32 [out, in], 2)`` -> opaque uint8
  ``[out, in/2]`` (layout is ISA-specific: pack on the machine that runs it, don't ship it);
  needs ``out % 16 == 0`` (we pad rows) and group_size in {32, 64, 128, 256}.
  ``_weight_int4pack_mm_for_cpu`` is fast only for bf16 activations: fp32/fp16 are ~40-130x
  slower, so the default compute dtype is bf16 and other inputs are cast to it and back.
  ``compute_dtype=torch.float32`` keeps fp32 scales/zeros (exact dequant) for testing.
* CUDA (untested here): ``_convert_weight_to_int4pack(uint8 [out, in/2] with q[2j] in the high
  nibble, inner_k_tiles)`` + ``_weight_int4pack_mm`` with bf16 activations and bf16 scales.
* other devices: nibble-packed storage and a dequantize + ``F.linear`` reference path.

The CPU kernel's cost grows about linearly with rows, the packed bf16 GEMM's hardly at all at
first. Per layer of SmolLM2 (its four matmuls, 2 threads, Zen 4), with the weights streamed from
memory as in a served forward: int4 178 against 527 us at 1 row, 228 against 406 at 4, 425
against 368 at 6, 1738 against 1011 at 32 (int4_rows_cold.txt); with the weights hot in cache
bf16 already wins from 4 rows (int4_rows.txt; both in docs/results/2026-12-04-session21/). A layer
built with ``dense_twin=True`` also keeps its integers dequantized to bf16 in a oneDNN-packed
twin and runs that past ``INT4_KERNEL_MAX_ROWS`` rows: int4 speed for a few sequences, bf16 speed
for a batch, for the bytes of both. Worth it where the weights are small and speed is the point
(a draft model), not where int4 was chosen to save memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specserve.hardware import cpu_has_bf16_gemm
from specserve.layers.linear import PackedLinear

GROUP_SIZES = (32, 64, 128, 256)
INT4_KERNEL_MAX_ROWS = 4  # rows up to which a layer with a dense twin still runs the int4 kernel


def group_scale_zero(wg: torch.Tensor, scale_dtype: torch.dtype
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric min/max scale and zero of each group along wg's last dim, in scale_dtype
    (what is stored; integers are rounded against these stored values)."""
    wmin, wmax = wg.amin(-1), wg.amax(-1)
    scales = ((wmax - wmin).clamp(min=1e-6) / 15).to(scale_dtype)
    return scales, (wmin + 8 * scales.float()).to(scale_dtype)


def quantize_int4(
    w: torch.Tensor, group_size: int = 32, scale_dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [out, in] -> (q uint8 [out, in] in 0..15, scales, zeros [out, in/g] in scale_dtype).

    Asymmetric min/max per group. q is rounded against the *stored* (e.g. bf16-rounded) scale and
    zero, so storage rounding does not shift whole groups.
    """
    out_f, in_f = w.shape
    if group_size not in GROUP_SIZES or in_f % group_size:
        raise ValueError(
            f"group_size must be in {GROUP_SIZES} and divide in_features={in_f}, got {group_size}"
        )
    wg = w.detach().float().reshape(out_f, in_f // group_size, group_size)  # [out, G, g]
    scales, zeros = group_scale_zero(wg, scale_dtype)  # [out, G]
    q = torch.round((wg - zeros.float()[..., None]) / scales.float()[..., None]) + 8
    return q.clamp_(0, 15).to(torch.uint8).reshape(out_f, in_f), scales, zeros


def dequantize_int4(
    q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """Reference: (q - 8) * scale + zero -> fp32 [out, in]."""
    out_f, in_f = q.shape
    qg = q.float().reshape(out_f, in_f // group_size, group_size) - 8  # [out, G, g]
    return (qg * scales.float()[..., None] + zeros.float()[..., None]).reshape(out_f, in_f)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q uint8 [out, in] -> [out, in/2], q[:, 2j] in the high nibble (the CUDA op's input)."""
    return (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)


def _unpack_nibbles(p: torch.Tensor) -> torch.Tensor:
    return torch.stack([p >> 4, p & 15], dim=-1).reshape(p.shape[0], -1)  # [out, in]


class Int4Linear(nn.Module):
    """``nn.Linear`` replacement running group-wise int4 weights through torch's int4pack mm."""

    def __init__(
        self,
        q: torch.Tensor,
        scales: torch.Tensor,
        zeros: torch.Tensor,
        group_size: int,
        bias: torch.Tensor | None = None,
        compute_dtype: torch.dtype = torch.bfloat16,
        dense_twin: bool = False,
    ):
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.group_size, self.compute_dtype = group_size, compute_dtype
        self.layout = q.device.type if q.device.type in ("cpu", "cuda") else "ref"
        if self.layout == "cuda" and compute_dtype != torch.bfloat16:
            raise ValueError("the CUDA int4 kernel only takes bf16 activations")
        # See the module docstring; a bf16 twin only where oneDNN runs bf16 GEMMs natively.
        self.twin: PackedLinear | None = None
        if (dense_twin and self.layout == "cpu" and compute_dtype == torch.bfloat16
                and cpu_has_bf16_gemm() and bias is None):
            w = dequantize_int4(q, scales, zeros, group_size).to(torch.bfloat16)
            self.twin = PackedLinear(w, None)
        pad = -self.out_features % 16 if self.layout != "ref" else 0
        if pad:  # rows of q=8, scale=0, zero=0 dequantize to 0; sliced off after the matmul
            q = F.pad(q, (0, 0, 0, pad), value=8)
            scales, zeros = F.pad(scales, (0, 0, 0, pad)), F.pad(zeros, (0, 0, 0, pad))
        sz = torch.stack([scales, zeros], dim=-1).to(compute_dtype)  # [out_p, G, 2]
        self.register_buffer("scales_and_zeros", sz.transpose(0, 1).contiguous())  # [G, out_p, 2]
        if self.layout == "cpu":
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 2)
        elif self.layout == "cuda":
            k_tiles = next(t for t in (8, 4, 2) if self.in_features % (t * 16) == 0)
            packed = torch.ops.aten._convert_weight_to_int4pack(_pack_nibbles(q), k_tiles)
        else:
            packed = _pack_nibbles(q)
        self.register_buffer("weight", packed)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())  # [out]
        # The decode hot path: 2-D input in the compute dtype, nothing to slice or add.
        self._direct = self.layout == "cpu" and pad == 0 and bias is None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 32,
                    dense_twin: bool = False) -> Int4Linear:
        q, s, z = quantize_int4(linear.weight, group_size)
        return cls(q, s, z, group_size, linear.bias, dense_twin=dense_twin)

    @property
    def weight_nbytes(self) -> int:
        """Bytes of packed weights + scales/zeros (bias excluded, as for nn.Linear). A twin is a
        submodule of its own and counts itself."""
        return self.weight.nbytes + self.scales_and_zeros.nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [..., in] -> [..., out], same dtype as x
        if (self.twin is not None and x.dtype == self.compute_dtype
                and x.numel() > INT4_KERNEL_MAX_ROWS * self.in_features):
            return self.twin(x)
        if self._direct and x.dim() == 2 and x.dtype == self.compute_dtype and x.is_contiguous():
            # torch's own binding: a third of torch.ops.aten's call overhead (120 calls a step)
            return torch._weight_int4pack_mm_for_cpu(x, self.weight, self.group_size,
                                                     self.scales_and_zeros)
        shape, dtype = x.shape, x.dtype
        x2 = x.reshape(-1, self.in_features).to(self.compute_dtype)  # [tokens, in]
        if self.layout != x.device.type and self.layout != "ref":
            raise RuntimeError(f"Int4Linear packed for {self.layout}, got input on {x.device}")
        if self.layout == "cpu":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x2, self.weight, self.group_size, self.scales_and_zeros
            )
        elif self.layout == "cuda":
            y = torch.ops.aten._weight_int4pack_mm(
                x2, self.weight, self.group_size, self.scales_and_zeros
            )
        else:
            sz = self.scales_and_zeros.transpose(0, 1)  # [out, G, 2]
            q = _unpack_nibbles(self.weight)  # [out, in]
            w = dequantize_int4(q, sz[..., 0], sz[..., 1], self.group_size)
            y = F.linear(x2, w.to(x2.dtype))
        y = y[:, : self.out_features].to(dtype)  # drop row padding (no-op if out % 16 == 0)
        if self.bias is not None:
            y = y + self.bias.to(dtype)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"group_size={self.group_size}, int4 ({self.layout}, {self.compute_dtype})"
            + (f", bf16 twin above {INT4_KERNEL_MAX_ROWS} rows" if self.twin is not None else "")
        )
