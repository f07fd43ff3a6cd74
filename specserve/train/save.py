"""Write a trained draft as a directory that `load_model` and the draft proposer read.

Layout: config.json (a Llama config with the target's shapes and N layers, plus a
"specserve_draft" section naming the target), model.safetensors (the draft's layers, final norm
and head in Hugging Face names; never the embedding, which is the target's), head_ids.json (the
vocabulary id of each head row), calibration.json (a sample of the training sequences, from
which the loader calibrates int4 weights), the target's tokenizer files, and training.json (the
report).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

from specserve.models.loader import EMBEDDED_NAME, is_embedded
from specserve.models.shared_embedding import embedding_probe
from specserve.quant.gptq import MAX_CALIBRATION_LEN
from specserve.train.data import Sample
from specserve.train.draft_net import DraftNet
from specserve.train.whole_dir import written_whole

HEAD_IDS_FILE = "head_ids.json"
CALIBRATION_FILE = "calibration.json"
# Tokens of training sequences kept for int4 calibration (GPTQ): enough for the input statistics
# of a draft's few layers (13k and 34k tokens gave the same acceptance), ~100 KB of JSON, ~7 s at
# load time.
CALIBRATION_TOKENS = 16384


def cached_draft_path(target: str | None, workload: str, layers: int) -> Path:
    """Default home of a draft trained for the lab:
    ~/.cache/specserve/drafts/<target>-<workload>-<layers> ($SPECSERVE_CACHE moves the root).
    target None is the embedded model. A path is named by its last part and a digest of the
    whole resolved path: two checkpoints that share a folder name (runs/a/final, runs/b/final;
    a local copy of SmolLM2-135M-Instruct beside the embedded one) must not share a draft."""
    root = Path(os.environ.get("SPECSERVE_CACHE", Path.home() / ".cache" / "specserve"))
    if is_embedded(target):
        name = EMBEDDED_NAME
    else:
        where = Path(str(target)).expanduser().resolve()
        digest = hashlib.sha256(str(where).encode()).hexdigest()[:8]
        name = f"{where.name or 'target'}.{digest}"
    safe = "-".join(re.sub(r"[^\w.+-]", "_", part)
                    for part in (name, workload.replace(",", "+"), str(layers)))
    return root / "drafts" / safe


def target_fingerprint(target: str | None) -> str:
    """A digest of a target's weights as they lie on disk: each weight file's name, size and
    first and last MiB, and config.json's text. A draft cached for the lab is trained again
    when it changes (a checkpoint fine-tuned or re-exported in place keeps its path, which is
    all the cache's name holds). Cheap, not exhaustive: it reads 2 MiB a file."""
    from specserve.models.loader import embedded_model_path

    path = Path(embedded_model_path() if is_embedded(target) else target).expanduser()
    if not path.exists():
        return ""  # loading it fails with the reason
    files = [path] if path.is_file() else sorted(
        f for f in path.iterdir() if f.suffix in (".safetensors", ".gguf", ".bin"))
    digest = hashlib.sha256()
    if path.is_dir() and (path / "config.json").is_file():
        digest.update((path / "config.json").read_bytes())
    for f in files:
        size = f.stat().st_size
        digest.update(f"{f.name}:{size}".encode())
        with f.open("rb") as fh:
            digest.update(fh.read(1 << 20))
            fh.seek(max(size - (1 << 20), 0))
            digest.update(fh.read(1 << 20))
    return digest.hexdigest()[:16]


def calibration_sample(samples: Sequence[Sample], seed: int,
                       max_tokens: int = CALIBRATION_TOKENS) -> list[list[int]]:
    """Training sequences (prompt + the target's reply), taken round-robin over the kinds in a
    seeded order until max_tokens, for calibrating the draft's int4 weights at load time."""
    by_kind: dict[str, list[Sample]] = {}
    for s in samples:
        by_kind.setdefault(s.kind, []).append(s)
    rng = random.Random(seed)
    queues = [rng.sample(v, len(v)) for _, v in sorted(by_kind.items())]
    out: list[list[int]] = []
    total = 0
    while any(queues) and total < max_tokens:
        for q in queues:
            if q and total < max_tokens:
                # The tail, as the calibration forward would cut it: the reply is kept.
                ids = q.pop().token_ids[-MAX_CALIBRATION_LEN:]
                out.append(ids)
                total += len(ids)
    return out


def draft_config(draft: DraftNet, target_name: str, target_embedding: torch.Tensor,
                 calibrated: bool = False) -> dict:
    c = draft.cfg
    return {
        # Qwen3's q/k norms need its model_type; every other target's draft reads as a Llama.
        "architectures": ["Qwen3ForCausalLM" if c.qk_norm else "LlamaForCausalLM"],
        "model_type": "qwen3" if c.qk_norm else "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "max_position_embeddings": c.max_position,
        "rope_theta": c.rope_theta,
        **({"rope_parameters": dict(c.rope_scaling) | {"rope_theta": c.rope_theta}}
           if c.rope_scaling else {}),
        "rms_norm_eps": c.rms_norm_eps,
        "attention_bias": c.attention_bias,  # a Qwen2 target's q/k/v biases are kept
        "tie_word_embeddings": False,  # the head is the draft's own (reduced) copy
        "eos_token_id": list(c.eos_token_ids),
        "torch_dtype": "float32",
        "specserve_draft": {
            "target": target_name,
            "target_vocab_size": c.vocab_size,
            "hidden_size": c.hidden_size,
            "head_vocab_ids_file": None if draft.head_ids is None else HEAD_IDS_FILE,
            "head_vocab_size": draft.head_size,
            "calibration_file": CALIBRATION_FILE if calibrated else None,
            "shares_target_embedding": True,
            "target_embedding_probe": embedding_probe(target_embedding),
        },
    }


def draft_tensors(draft: DraftNet) -> dict[str, torch.Tensor]:
    """The draft's weights in Hugging Face names (the loader fuses q/k/v and gate/up again)."""
    c = draft.cfg
    out = {"model.norm.weight": draft.norm.weight, "lm_head.weight": draft.head.weight}
    for i, layer in enumerate(draft.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = layer.input_norm.weight
        out[p + "post_attention_layernorm.weight"] = layer.post_attn_norm.weight
        split = [c.q_size, c.kv_size, c.kv_size]
        for x, w in zip("qkv", layer.attn.qkv_proj.weight.split(split), strict=True):
            out[p + f"self_attn.{x}_proj.weight"] = w
        if layer.attn.qkv_proj.bias is not None:
            for x, b in zip("qkv", layer.attn.qkv_proj.bias.split(split), strict=True):
                out[p + f"self_attn.{x}_proj.bias"] = b
        out[p + "self_attn.o_proj.weight"] = layer.attn.o_proj.weight
        if layer.attn.q_norm is not None:
            out[p + "self_attn.q_norm.weight"] = layer.attn.q_norm.weight
            out[p + "self_attn.k_norm.weight"] = layer.attn.k_norm.weight
        gate, up = layer.mlp.gate_up_proj.weight.chunk(2)
        out[p + "mlp.gate_proj.weight"] = gate
        out[p + "mlp.up_proj.weight"] = up
        out[p + "mlp.down_proj.weight"] = layer.mlp.down_proj.weight
    return {k: v.detach().float().contiguous().clone() for k, v in out.items()}


def save_draft(out_dir: str | Path, draft: DraftNet, target_name: str,
               target_embedding: torch.Tensor, tokenizer, report: dict,
               calibration: list[list[int]] | None = None) -> Path:
    final = Path(out_dir).expanduser()
    config = draft_config(draft, target_name, target_embedding, calibrated=bool(calibration))
    with written_whole(final) as out:
        if calibration:
            (out / CALIBRATION_FILE).write_text(json.dumps(calibration) + "\n")
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(draft_tensors(draft), str(out / "model.safetensors"))
        if draft.head_ids is not None:
            (out / HEAD_IDS_FILE).write_text(json.dumps(draft.head_ids.tolist()) + "\n")
        tokenizer.save_pretrained(str(out))
        (out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    return final
