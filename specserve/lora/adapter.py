"""A PEFT LoRA adapter read into the fused linears of specserve's Llama.

The model fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj`, so an adapter's updates of
a fused linear's slices become one update of the fused linear: their A matrices stacked, their B
matrices placed block-diagonally in the fused output (a slice the adapter leaves alone gets zero
rows), the scale (lora_alpha / r, or / sqrt(r) with rsLoRA) folded into B. One step then adds
`(x @ A.T) @ B.T` per fused linear (stored transposed: `(x @ a) @ b`), whatever subset of
projections the adapter trained.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from specserve.config import ModelConfig
from specserve.lora.request import LoRARequest

# PEFT's module name -> (specserve's fused linear, slice of its output)
_TARGETS = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
            "o_proj": ("o_proj", 0), "gate_proj": ("gate_up_proj", 0),
            "up_proj": ("gate_up_proj", 1), "down_proj": ("down_proj", 0)}
# PEFT saves without the adapter's name; other tools keep it (`lora_A.default.weight`).
_KEY = re.compile(
    r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$")
# adapter_config.json entries that change what the weights mean; an adapter that sets them to
# anything but these would be applied wrongly, so it is refused by name.
_PLAIN = {"use_dora": (False, None), "fan_in_fan_out": (False, None), "bias": ("none", None),
          "modules_to_save": (None, []), "alpha_pattern": ({}, None),
          "layer_replication": (None, []), "lora_bias": (False, None),
          "alora_invocation_tokens": (None, []), "target_parameters": (None, []),
          "use_qalora": (False, None), "use_bdlora": (None, False), "arrow_config": (None,)}
_BASE_CHANGING_INITS = ("pissa", "olora", "corda", "loftq", "lora_ga")


@dataclass(slots=True)
class LoRALinear:
    """One fused linear's update: y += (x @ a) @ b, both stored transposed from PEFT's
    layout so that each product reads a contiguous right operand."""

    a: torch.Tensor  # [in_features, sum of the slices' ranks], the model's dtype
    b: torch.Tensor  # [sum of the slices' ranks, out_features], scaled
    # fp32 copies for a bf16 model on a CPU, where torch's bf16 matmuls with a rank-16 side
    # cost more than fp32's below ~8 rows (batch.FEW_ROWS); None elsewhere.
    a32: torch.Tensor | None = None
    b32: torch.Tensor | None = None


_LOADS = itertools.count(1)


@dataclass(slots=True)
class LoRAAdapter:
    request: LoRARequest
    rank: int  # the largest slice rank
    layers: list[dict[str, LoRALinear]]  # per decoder layer: fused linear name -> update
    nbytes: int
    # Unique to this load, never reused: the prefix cache keys KV by it, so that an id removed
    # and given to other weights (or the same directory reloaded after it changed) is never
    # served KV its predecessor computed.
    uid: int = dataclasses.field(default_factory=lambda: next(_LOADS))


def fused_shapes(cfg: ModelConfig) -> dict[str, tuple[int, list[int]]]:
    """Each fused linear's input size and its slices' output sizes, in order."""
    h, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    return {"qkv_proj": (h, [q, kv, kv]), "o_proj": (q, [h]), "gate_up_proj": (h, [inter, inter]),
            "down_proj": (inter, [h])}


def load_adapter(request: LoRARequest, cfg: ModelConfig, max_rank: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> LoRAAdapter:
    """Read and check a PEFT LoRA directory for this model, its updates kept in the model's
    dtype on its device (and in fp32 too for a bf16 model on a CPU). Raises ValueError naming
    what does not fit (another model's shapes, a rank over max_rank, a kind of update not
    applied here)."""
    try:
        path = Path(request.lora_path).expanduser()
    except RuntimeError as exc:  # ~user of no such user
        raise ValueError(f"LoRA adapter {request.lora_path}: {exc}") from None
    conf = _read_config(path)
    pieces: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in _read_tensors(path).items():
        m = _KEY.search(key)
        if m is None or m.group(2) not in _TARGETS:
            raise ValueError(f"LoRA adapter {path}: {key} is not an update specserve applies "
                             "(LoRA on q/k/v/o_proj and gate/up/down_proj only)")
        layer = int(m.group(1))
        if layer >= cfg.num_layers:
            raise ValueError(f"LoRA adapter {path}: {key} is for layer {layer}, but the model "
                             f"has {cfg.num_layers} layers")
        piece = pieces.setdefault((layer, m.group(2)), {})
        if m.group(3) in piece:
            raise ValueError(f"LoRA adapter {path}: two lora_{m.group(3)} weights for "
                             f"layers.{layer}.{m.group(2)} (several adapters in one file?)")
        piece[m.group(3)] = tensor
    if not pieces:
        raise ValueError(f"LoRA adapter {path} holds no LoRA weights")
    shapes = fused_shapes(cfg)
    layers: list[dict[str, LoRALinear]] = [{} for _ in range(cfg.num_layers)]
    by_fused: dict[tuple[int, str], list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
    rank = 0
    for (layer, module), ab in sorted(pieces.items()):
        fused, index = _TARGETS[module]
        in_features, outs = shapes[fused]
        a, b = ab.get("A"), ab.get("B")
        name = f"layers.{layer}.{module}"
        if a is None or b is None:
            raise ValueError(f"LoRA adapter {path}: {name} has lora_A or lora_B but not both")
        r = a.shape[0]
        if r == 0 or a.shape != (r, in_features) or b.shape != (outs[index], r):
            raise ValueError(
                f"LoRA adapter {path} does not fit this model: {name} has lora_A "
                f"{list(a.shape)} and lora_B {list(b.shape)}, expected [r, {in_features}] and "
                f"[{outs[index]}, r] (an adapter trained for another base model?)")
        if r > max_rank:
            raise ValueError(f"LoRA adapter {path}: rank {r} of {name} is over max_lora_rank "
                             f"{max_rank}")
        rank = max(rank, r)
        scale = conf["lora_alpha"] / (math.sqrt(r) if conf.get("use_rslora") else r)
        by_fused.setdefault((layer, fused), []).append((index, a.float(), b.float() * scale))
    nbytes = 0
    for (layer, fused), parts in by_fused.items():
        outs = shapes[fused][1]
        offsets = [sum(outs[:i]) for i in range(len(outs))]
        total_r = sum(a.shape[0] for _, a, _ in parts)
        b_full = torch.zeros(sum(outs), total_r)
        col = 0
        for index, a, b in parts:
            b_full[offsets[index]:offsets[index] + outs[index], col:col + a.shape[0]] = b
            col += a.shape[0]
        a_t, b_t = torch.cat([a for _, a, _ in parts]).T.contiguous(), b_full.T.contiguous()
        update = LoRALinear(a_t.to(device, dtype), b_t.to(device, dtype))
        if torch.device(device).type == "cpu" and dtype != torch.float32:
            # The rounded weights, widened: a step of few rows computes in fp32 with the very
            # weights a larger one uses in bf16 (only the accumulation's precision differs).
            update.a32, update.b32 = update.a.float(), update.b.float()
        layers[layer][fused] = update
        nbytes += sum(t.nbytes for t in (update.a, update.b, update.a32, update.b32)
                      if t is not None)
    return LoRAAdapter(request, rank, layers, nbytes)


def _read_config(path: Path) -> dict:
    try:
        conf = json.loads((path / "adapter_config.json").read_text())
    except FileNotFoundError:
        raise ValueError(f"LoRA adapter {path}: no adapter_config.json (a PEFT adapter "
                         "directory, as PeftModel.save_pretrained writes it)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"LoRA adapter {path}: cannot read adapter_config.json ({exc})") from None
    if not isinstance(conf, dict) or conf.get("peft_type", "LORA") != "LORA":
        kind = conf.get("peft_type") if isinstance(conf, dict) else conf
        raise ValueError(f"LoRA adapter {path}: not a LoRA adapter (peft_type {kind!r})")
    for key, plain in _PLAIN.items():
        if conf.get(key, plain[0]) not in plain:
            raise ValueError(f"LoRA adapter {path}: {key}={conf[key]!r} is not supported")
    init = conf.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(_BASE_CHANGING_INITS):
        # Saved without PEFT's conversion, such an adapter fits only the base weights its
        # initialisation rewrote, not the model served here.
        raise ValueError(f"LoRA adapter {path}: init_lora_weights={init!r} changes the base "
                         "weights; save it converted to a plain LoRA (PEFT's "
                         "path_initial_model_for_weight_conversion)")
    alpha = conf.get("lora_alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(
            alpha):
        raise ValueError(f"LoRA adapter {path}: lora_alpha must be a finite number, not "
                         f"{alpha!r}")
    return conf


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The adapter's tensors; a file that does not read (truncated, not a weights file) is a
    ValueError like any other unfit adapter, so the server refuses it cleanly."""
    for name, read in (("adapter_model.safetensors", load_file),
                       ("adapter_model.bin", lambda f: torch.load(f, map_location="cpu",
                                                                  weights_only=True))):
        if (path / name).is_file():
            try:
                tensors = read(path / name)
            except Exception as exc:  # safetensors, unpickling and OS errors alike
                raise ValueError(f"LoRA adapter {path}: cannot read {name} ({exc})") from None
            if not isinstance(tensors, dict) or not all(
                    isinstance(k, str) and isinstance(t, torch.Tensor) and t.dim() == 2
                    and t.is_floating_point() for k, t in tensors.items()):
                raise ValueError(f"LoRA adapter {path}: {name} does not hold 2-D float "
                                 "tensors by name")
            return tensors
    raise ValueError(f"LoRA adapter {path}: no adapter_model.safetensors (or .bin)")
