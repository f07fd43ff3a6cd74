"""GPTQ (Frantar et al. 2022) for the group-wise int4 format of quant/int4.py.

Why: round-to-nearest int4 (min/max per group of 32) moves each weight by up to half a step, and
a small network has no depth to average those errors out. Measured on the 3-layer draft that
`train-draft` makes for SmolLM2-135M: round-to-nearest cut its served greedy acceptance from 0.45
to 0.11 on json. GPTQ quantizes one input column at a time and pushes each column's rounding
error onto the columns not yet quantized, weighted by the inverse Hessian of the layer's
reconstruction loss ||X W^T - X Q^T||^2 (H = X^T X over calibration inputs), so the layer's
*outputs* on real activations move as little as possible.

The result is the same (q, scales, zeros) triple as `quantize_int4`, so it runs through the same
Int4Linear kernels; only the choice of integers differs (quant/swap.py's quantize_model picks
GPTQ for int4 when it is given calibration data).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from specserve.quant.int4 import GROUP_SIZES, group_scale_zero


def gptq_int4(w: torch.Tensor, hessian: torch.Tensor, group_size: int = 32,
              block_size: int = 128, damp: float = 0.01,
              scale_dtype: torch.dtype = torch.bfloat16
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [out, in], hessian [in, in] (X^T X of the layer's inputs) -> (q uint8 [out, in] in
    0..15, scales, zeros [out, in / group_size]) with w ~ (q - 8) * scale + zero per group.
    A group's scale and zero come from its columns as they stand when the group is reached,
    i.e. after the earlier columns' errors were pushed onto them (GPTQ's static groups)."""
    out_f, in_f = w.shape
    if group_size not in GROUP_SIZES or in_f % group_size or block_size % group_size:
        raise ValueError(f"group_size must be in {GROUP_SIZES} and divide in_features={in_f} "
                         f"and block_size={block_size}, got {group_size}")
    w = w.detach().float().clone()
    h = hessian.detach().to(w.device, torch.float64)  # a copy: damped in place below
    dead = torch.diag(h) == 0  # inputs that never fire: nothing to preserve there
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h += damp * torch.diag(h).mean() * torch.eye(in_f, dtype=h.dtype, device=h.device)
    # Upper Cholesky factor of H^-1: row i holds how column i's error spreads to columns > i.
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    hinv = hinv.float()
    q = torch.empty(out_f, in_f, dtype=torch.uint8, device=w.device)
    num_groups = in_f // group_size
    scales = torch.empty(out_f, num_groups, dtype=scale_dtype, device=w.device)
    zeros = torch.empty(out_f, num_groups, dtype=scale_dtype, device=w.device)
    for b0 in range(0, in_f, block_size):
        b1 = min(b0 + block_size, in_f)
        wb = w[:, b0:b1].clone()
        errs = torch.empty_like(wb)
        hb = hinv[b0:b1, b0:b1]
        for i in range(b1 - b0):
            col = b0 + i
            if col % group_size == 0:
                g = col // group_size
                scale, zero = group_scale_zero(wb[:, i:i + group_size], scale_dtype)
                scales[:, g], zeros[:, g] = scale, zero
                scale, zero = scale.float(), zero.float()
            x = wb[:, i]
            qi = (torch.round((x - zero) / scale) + 8).clamp_(0, 15)
            q[:, col] = qi.to(torch.uint8)
            err = (x - ((qi - 8) * scale + zero)) / hb[i, i]
            wb[:, i:] -= err[:, None] * hb[i, i:][None, :]
            errs[:, i] = err
        w[:, b1:] -= errs @ hinv[b0:b1, b1:]
    return q, scales, zeros


class HessianCollector:
    """Accumulates X^T X of the inputs of every named nn.Linear while calibration data runs
    through the model (forward pre-hooks); `remove()` detaches the hooks."""

    def __init__(self, model: nn.Module, names: Iterable[str]):
        self.hessians: dict[str, torch.Tensor] = {}
        self.num_rows: dict[str, int] = {}
        self._hooks = [model.get_submodule(n).register_forward_pre_hook(self._hook(n))
                       for n in names]

    def _hook(self, name: str):
        def hook(_module: nn.Module, args: tuple) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            xtx = (x.T @ x).double()  # fp32 products per batch, summed in fp64
            h = self.hessians.get(name)
            self.hessians[name] = xtx if h is None else h + xtx
            self.num_rows[name] = self.num_rows.get(name, 0) + x.shape[0]
        return hook

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []


# Calibration sequences longer than this are cut: the dense forward's attention is quadratic,
# and a few thousand positions already cover a layer's input statistics.
MAX_CALIBRATION_LEN = 2048


def calibration_hessians(model: nn.Module, names: Sequence[str],
                        calibration: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
    """The mean X^T X of the inputs each named linear of a LlamaModel sees while `calibration`
    (token id sequences) runs through the model as it stands, unquantized. Every layer is
    calibrated on the original model's activations in one pass: for the few layers of a draft
    that recovers its served acceptance (docs/performance.md), so GPTQ's sequential variant
    (each layer calibrated behind the already quantized ones) is not needed."""
    from specserve.train.dense_forward import dense_hidden  # plain forward, no KV pool needed

    collector = HessianCollector(model, names)
    device = next(model.parameters()).device
    try:
        with torch.inference_mode():
            for ids in calibration:
                if ids:
                    dense_hidden(model, torch.tensor([list(ids)[-MAX_CALIBRATION_LEN:]],
                                                     device=device))
    finally:
        collector.remove()
    return {n: collector.hessians[n] / collector.num_rows[n] for n in names}
