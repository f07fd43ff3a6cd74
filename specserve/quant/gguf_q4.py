"""Run GGUF Q4_1 weights directly on torch's int4pack kernel, without requantizing.

Q4_1 block (20 bytes, 32 weights along the input dim): fp16 d, fp16 m, 16 bytes of nibbles;
byte j holds weight j in its low nibble and weight j+16 in its high nibble; w = d * q + m.
Since d*q + m == (q - 8) * d + (m + 8d), a Q4_1 row maps onto int4pack (group size 32) with
scale = d and zero = m + 8d: the nibbles are used as-is.

Precision: the CPU kernel wants scales/zeros in the activation dtype and is only fast with bf16
activations, so d and m + 8d are rounded to bf16 (unit roundoff 2^-8): per weight the error is at
most 2^-8 * (8|d| + |m + 8d|). Measured on SmolLM2-135M Q4_1 (blk.0 and blk.15, all matrices):
max |w_eff - w_exact| = 1.6e-2 (blk.0.attn_q, |w| up to 5.25), never more than 4.6% of the
group's Q4 step d, small next to Q4's own rounding (d/2); layer outputs differ from
``x @ dequantized.T`` by ~0.3% relative (half of it the bf16 rounding of x and of the output).
fp32 scales/zeros do work, with fp32 activations (``compute_dtype=torch.float32``): effective
weights are then exact (outputs match to ~1e-6 relative), but that kernel path is ~40-120x slower.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from specserve.quant.int4 import Int4Linear

QK = 32  # weights per block
BLOCK_BYTES = 20  # fp16 d + fp16 m + 16 nibble bytes


def concat_raw(parts: Sequence[np.ndarray], perm: Sequence[int] | None = None) -> np.ndarray:
    """Row-concatenate raw Q4_1 matrices (e.g. q, k, v -> qkv) and optionally permute the rows.

    Quantization is per row along the input dim, so row surgery on raw bytes is lossless.
    """
    raw = np.concatenate([np.asarray(p, dtype=np.uint8) for p in parts], axis=0)  # [out, nbytes]
    return raw if perm is None else raw[np.asarray(perm)]


def unpack_q4_1(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """raw uint8 [out, nbytes] -> (q uint8 [out, in] 0..15, d fp16 [out, in/32], m fp16 [...])."""
    raw = np.array(raw, dtype=np.uint8)  # copy: gguf arrays are read-only mmaps
    if raw.ndim != 2 or raw.shape[1] % BLOCK_BYTES:
        raise ValueError(f"expected [rows, k*{BLOCK_BYTES}] uint8 Q4_1 bytes, got {raw.shape}")
    out_f, nb = raw.shape[0], raw.shape[1] // BLOCK_BYTES
    blocks = torch.from_numpy(raw).reshape(out_f, nb, BLOCK_BYTES)  # [out, nb, 20]
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1)  # [out, nb]
    m = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1)  # [out, nb]
    qs = blocks[..., 4:]  # [out, nb, 16]
    q = torch.cat([qs & 15, qs >> 4], dim=-1)  # [out, nb, 32]: low nibbles first
    return q.reshape(out_f, nb * QK), d, m


def dequantize_q4_1(raw: np.ndarray) -> torch.Tensor:
    """Exact fp32 dequantization [out, in], bit-identical to gguf.quants.dequantize."""
    q, d, m = unpack_q4_1(raw)
    out_f, in_f = q.shape
    qg = q.reshape(out_f, in_f // QK, QK).float()  # [out, nb, 32]
    # d*q then + m, two fp32 roundings, same as the numpy reference (no fma)
    return (qg * d.float()[..., None] + m.float()[..., None]).reshape(out_f, in_f)


class GGUFQ4Linear(Int4Linear):
    """Int4Linear built from raw Q4_1 rows (one matrix, or a list of row-concatenated parts)."""

    @classmethod
    def from_raw(
        cls,
        raw: np.ndarray | Sequence[np.ndarray],
        bias: torch.Tensor | None = None,
        *,
        device: torch.device | str = "cpu",
        compute_dtype: torch.dtype = torch.bfloat16,
    ) -> GGUFQ4Linear:
        if not isinstance(raw, np.ndarray):
            raw = concat_raw(raw)
        q, d, m = unpack_q4_1(raw)
        d32, m32 = d.float(), m.float()
        zeros = m32 + 8 * d32  # rounded once, to compute_dtype, inside Int4Linear
        bias = None if bias is None else bias.to(device)
        return cls(q.to(device), d32.to(device), zeros.to(device), QK, bias, compute_dtype)
