"""Swap ``nn.Linear`` modules for quantized ones, in place (gpt-fast style).

Why a module swap: the model code keeps calling ``self.qkv_proj(x)``; only the module changes.
Quantize *after* moving the model to its device: int4 weights are packed in a device/ISA-specific
layout. ``lm_head`` is skipped by default because it is tied to the embedding.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from specserve.config import QUANTIZATION_METHODS
from specserve.hardware import cpu_has_bf16_gemm
from specserve.layers.linear import PackedLinear
from specserve.quant.fp8 import Fp8Linear
from specserve.quant.gguf_q4 import BLOCK_BYTES, QK, GGUFQ4Linear, concat_raw
from specserve.quant.gptq import calibration_hessians, gptq_int4
from specserve.quant.int4 import Int4Linear
from specserve.quant.int8 import Int8Linear
from specserve.quant.lm_head import Int8LMHead

logger = logging.getLogger("specserve")

METHODS = ("int8", "int4", "fp8")
QUANT_MODULES = (Int8Linear, Int4Linear, Fp8Linear)  # GGUFQ4Linear is an Int4Linear


def _skipped(name: str, skip: Iterable[str]) -> bool:
    """`name` matches an entry exactly, as a dotted suffix (``lm_head``) or as a prefix."""
    return any(name == s or name.endswith("." + s) or name.startswith(s + ".") for s in skip)


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, new)


def quantize_model(
    model: nn.Module,
    method: str,
    *,
    group_size: int = 32,
    skip: Sequence[str] = ("lm_head",),
    calibration: Sequence[Sequence[int]] | None = None,
    dense_twin: bool = False,
) -> nn.Module:
    """Replace each ``nn.Linear`` not in `skip` by its `method`-quantized version; returns model.
    calibration: token id sequences; with them int4 picks its integers by GPTQ (quant/gptq.py)
    from the inputs each linear sees on them, instead of rounding to nearest.
    dense_twin: int4 layers also keep a packed bf16 image for many rows (quant/int4.py)."""
    if method not in METHODS:
        raise ValueError(f"unknown quantization method {method!r}; valid: {', '.join(METHODS)}")
    targets = [
        (n, m) for n, m in model.named_modules() if type(m) is nn.Linear and not _skipped(n, skip)
    ]
    hessians = (calibration_hessians(model, [n for n, _ in targets], calibration)
                if method == "int4" and calibration else None)
    for name, lin in targets:
        with torch.no_grad():
            if method == "int8":
                new: nn.Module = Int8Linear.from_linear(lin)
            elif method == "int4" and hessians is not None:
                new = Int4Linear(*gptq_int4(lin.weight, hessians[name], group_size), group_size,
                                 lin.bias, dense_twin=dense_twin)
            elif method == "int4":
                new = Int4Linear.from_linear(lin, group_size, dense_twin=dense_twin)
            else:
                new = Fp8Linear.from_linear(lin)
        _replace(model, name, new)
    return model


def replace_with_gguf(
    model: nn.Module,
    raw_weights: Mapping[str, np.ndarray | Sequence[np.ndarray]],
    *,
    device: torch.device | str = "cpu",
) -> nn.Module:
    """Swap the named ``nn.Linear`` modules for GGUFQ4Linear built from raw Q4_1 rows.

    `raw_weights` maps a module name (e.g. ``layers.0.attn.qkv_proj``) to its uint8
    ``[out, nbytes]`` Q4_1 bytes, or to a list of parts to row-concatenate (q, k, v); apply any
    row permutation to the bytes first (``concat_raw(parts, perm)``). The Linear's bias, if any,
    is kept; its weight is never read (it may be on the meta device).
    """
    for name, raw in raw_weights.items():
        lin = model.get_submodule(name)
        if not isinstance(lin, nn.Linear):
            raise TypeError(f"{name} is {type(lin).__name__}, expected nn.Linear")
        raw = raw if isinstance(raw, np.ndarray) else concat_raw(raw)
        shape = (raw.shape[0], raw.shape[1] // BLOCK_BYTES * QK)
        if shape != (lin.out_features, lin.in_features):
            raise ValueError(f"{name}: Q4_1 rows give {shape}, module is {tuple(lin.weight.shape)}")
        bias = lin.bias
        if bias is not None and bias.is_meta:  # placeholder, so a later load_state_dict fills it
            bias = torch.zeros(bias.shape, dtype=bias.dtype)
        _replace(model, name, GGUFQ4Linear.from_raw(raw, bias, device=device))
    return model


def linear_weight_nbytes(model: nn.Module) -> int:
    """Weight bytes of all linear layers, quantized or not (biases and embeddings excluded).
    A module's packed bf16 copy (an int4 twin, the int8 head's) is a PackedLinear submodule and
    is counted as one, once."""
    total = 0
    for m in model.modules():
        if isinstance(m, (*QUANT_MODULES, PackedLinear)):
            total += m.weight_nbytes
        elif isinstance(m, Int8LMHead):
            total += m.weight.nbytes + m.scales.nbytes
        elif isinstance(m, nn.Linear):
            total += m.weight.nbytes
    return total


# Requantizing modes whose decode is fast enough that the bf16 LM head weighs on it (CPU): their
# head goes int8 too. Not gguf: that mode runs the file's weights as shipped, and the tied head
# ships as Q8_0 (groups of 32), which a per-row int8 head would requantize.
INT8_HEAD_METHODS = ("int8", "int4")


def apply_quantization(model: nn.Module, method: str | None,
                       raw_quantized: Mapping[str, tuple[np.ndarray, str]] | None = None,
                       calibration: Sequence[Sequence[int]] | None = None,
                       draft: bool = False) -> nn.Module:
    """The engine's entry point: `method` None leaves the model as is; "gguf" runs the GGUF's
    own Q4_1 rows (the embedded model) without requantizing; the rest quantize in place.
    calibration: token id sequences; with them "int4" picks its integers by GPTQ
    (quant/gptq.py) instead of rounding to nearest.
    draft: the model is a draft, whose weights are small and whose speed is all it is for: int4
    layers of a bf16 model keep a bf16 twin for many rows (quant/int4.py), and where bf16 GEMMs
    are native the LM head stays bf16 (the int8 head's kernel does not beat it on the Zen 4 where
    this was measured: quant/lm_head.py; elsewhere a bf16 head would run as an fp32 image)."""
    if method is None:
        return model
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"unknown quantization {method!r}; choose one of {QUANTIZATION_METHODS}")
    first = next(model.parameters())
    device = first.device
    if device.type == "cuda":
        # Measured on an H200 (docs/performance.md, "The CUDA path"): bf16 cuBLAS reads even a
        # 117 MB weight near the memory bound, and none of these ops beat it at 1 or 32 rows.
        logger.warning("%s weights on a GPU save memory, not time: bf16 linears are faster "
                       "there", method)
    if method != "gguf":
        quantize_model(model, method, calibration=calibration,
                       dense_twin=draft and first.dtype == torch.bfloat16)
    else:
        rows = {name: raw for name, (raw, qtype) in (raw_quantized or {}).items()
                if qtype == "Q4_1"}
        if not rows:
            raise ValueError("quantization='gguf' runs a GGUF file's own Q4_1 weights: load a "
                             ".gguf model with Q4_1 tensors (the embedded model has them)")
        replace_with_gguf(model, rows, device=device)
    head = getattr(model, "lm_head", None)
    if (method in INT8_HEAD_METHODS and device.type == "cpu" and type(head) is nn.Linear
            and not (draft and cpu_has_bf16_gemm())):
        model.lm_head = Int8LMHead(head.weight.detach())  # see quant/lm_head.py
    return model


def model_nbytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer (tied tensors counted once), plus the oneDNN-packed
    weight copies, which are neither."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.nbytes
    return total + sum(m.weight_nbytes for m in model.modules() if isinstance(m, PackedLinear))
