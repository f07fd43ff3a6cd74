"""The on-disk format of a trained EAGLE head, written by `train-draft --method eagle` and read
by the `eagle` proposer.

Layout: eagle.json (the target it was trained for: name, shapes, an embedding probe; the head's
vocabulary size), model.safetensors (`fc` and the decoder layer, in specserve's fused names;
never the embedding or the LM head, which are the target's), head_ids.json (the vocabulary id of
each LM-head row kept), the target's tokenizer files and training.json (the report).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specserve.config import ModelConfig
from specserve.models.shared_embedding import draft_embedding, embedding_probe
from specserve.spec_decode.draft_head import check_head_ids
from specserve.spec_decode.eagle_head import EagleHead
from specserve.train.whole_dir import written_whole

CONFIG_FILE = "eagle.json"
HEAD_IDS_FILE = "head_ids.json"


def save_eagle(out_dir: str | Path, head: EagleHead, target_name: str, tokenizer,
               report: dict) -> Path:
    final = Path(out_dir).expanduser()
    c = head.cfg
    config = {"specserve_eagle": {
        "target": target_name,
        "target_vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "num_heads": c.num_heads,
        "num_kv_heads": c.num_kv_heads,
        "intermediate_size": c.intermediate_size,
        "head_vocab_size": head.head_size,
        "feature_layers": list(head.feature_layers),
        "context": head.context,
        "target_embedding_probe": embedding_probe(head.embed_tokens.weight),
    }}
    tensors = {k: v.detach().float().contiguous().clone() for k, v in head.state_dict().items()
               if not k.startswith("lm_head.")}
    with written_whole(final) as out:
        (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(out / "model.safetensors"))
        if head.head_ids is not None:
            (out / HEAD_IDS_FILE).write_text(json.dumps(head.head_ids.tolist()) + "\n")
        tokenizer.save_pretrained(str(out))
        (out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    return final


def trained_context(path: Path, meta: dict) -> int | None:
    """The context window the head was trained over: eagle.json's, or for heads saved before it
    was recorded there (session 11) their training report's `head_context`; None: the whole
    context."""
    if "context" in meta:
        return meta["context"]
    report = path / "training.json"
    if report.is_file():
        return json.loads(report.read_text()).get("settings", {}).get("head_context")
    return None


def load_eagle(path: str | Path, cfg: ModelConfig, embed_tokens: torch.nn.Embedding,
               head_weight: torch.Tensor, dtype: torch.dtype, tokenizer=None) -> EagleHead:
    """cfg, embed_tokens, head_weight, tokenizer: the target's (the head shares the embedding
    and LM head, never copies them; the tokenizer must be the one it was trained with)."""
    path = Path(path).expanduser()
    cfg_file = path / CONFIG_FILE
    if not cfg_file.is_file():
        raise ValueError(f"{path} is not an EAGLE head ({CONFIG_FILE} missing): train one with "
                         "`specserve train-draft --method eagle`")
    meta = json.loads(cfg_file.read_text())["specserve_eagle"]
    c = cfg
    mine = (meta["hidden_size"], meta["num_heads"], meta["num_kv_heads"],
            meta["intermediate_size"])
    theirs = (c.hidden_size, c.num_heads, c.num_kv_heads, c.intermediate_size)
    if mine != theirs:
        raise ValueError(f"{path} was trained for a different target ({meta['target']}: hidden "
                         f"size, heads, kv heads, MLP size {mine}; this target has {theirs})")
    draft_embedding(path, meta, embed_tokens.weight)  # the same target? (shape and probe)
    if tokenizer is not None:
        from transformers import AutoTokenizer

        from specserve.spec_decode.draft_model import check_same_tokenizer

        check_same_tokenizer(tokenizer, AutoTokenizer.from_pretrained(str(path)))
    ids_file = path / HEAD_IDS_FILE
    head_ids = (torch.tensor(json.loads(ids_file.read_text()), dtype=torch.long)
                if ids_file.is_file() else None)
    if head_ids is not None:
        check_head_ids(head_ids, meta.get("head_vocab_size", len(head_ids)), c.vocab_size,
                       str(path))
    # Heads saved before fused features (session 11) read the final feature only.
    layers = tuple(meta.get("feature_layers", ()))
    try:
        head = EagleHead(c, embed_tokens, head_weight, head_ids, dtype, layers,
                         trained_context(path, meta))
    except ValueError as exc:  # it reads target layers this target does not have
        raise ValueError(f"{path} was trained for a different target: {exc}") from exc
    state = {k: v.to(dtype) for k, v in load_file(str(path / "model.safetensors")).items()}
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.startswith("lm_head.")]
    if missing or unexpected:
        raise ValueError(f"{path}: weights do not fit an EAGLE head: missing {missing}, "
                         f"unexpected {unexpected}")
    return head.to(head_weight.device).eval()  # beside the target's embedding and LM head
