"""Session 44: a saved EAGLE head's held-out greedy agreement, measured the old way and the new.

Old (sessions 3-43): every reply position counted, the first reply token included, and held-out
prompts clipped to max_context (1,024) tokens, their features taken over the clipped prompt.
New (33f5538): the first reply token left out (the target's prefill emits it; no draft guesses
it when serving) and the prompts read whole, as served.

The held-out set is the one the head was trained without: the seeded split train-draft made of
the lab's four workloads (its training.json's settings), replies generated greedily again.

    python docs/results/2026-12-06-session44/eval_heldout.py ~/.cache/specserve/drafts/s42-eagle-r16
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch

from specserve.llm import LLM
from specserve.models.llama import build_model
from specserve.models.loader import load_model
from specserve.spec_decode.eagle_io import load_eagle
from specserve.train.data import generate_samples, split_by_kind, unique_prompts, workload_prompts
from specserve.train.eagle import EagleConfig, agreement, featurize
from specserve.train.loop import autocast
from specserve.train.pipeline import _teacher


def main(path: str) -> None:
    report = json.loads((Path(path).expanduser() / "training.json").read_text())
    s = report["settings"]
    items = workload_prompts(report["source"].split(":", 1)[1])
    _, held_items = split_by_kind(unique_prompts(items), s["held_out_fraction"], s["seed"])
    llm = LLM(None, dtype=s["dtype"], seed=s["seed"])
    held = generate_samples(llm, held_items, s["max_reply_tokens"])
    del llm
    gc.collect()
    loaded = load_model(None)
    model = build_model(loaded.config, loaded.state_dict, torch.float32)
    teacher = _teacher(loaded, model, s["dtype"])
    head = load_eagle(path, loaded.config, model.embed_tokens, model.lm_head.weight.detach(),
                      torch.float32, loaded.tokenizer)
    cfg = EagleConfig(**{k: v for k, v in s.items() if k in EagleConfig.__dataclass_fields__})
    rows = {}
    with torch.no_grad(), autocast(cfg):
        for name, context, skip in (("old: clipped prompts, first token counted", s["max_context"],
                                     False),
                                    ("clipped prompts, first token left out", s["max_context"],
                                     True),
                                    ("new: whole prompts, first token left out", None, True)):
            feats = featurize(teacher, held, context, head.feature_layers, s["head_context"])
            rows[name] = agreement(head, feats, skip)
    kinds = sorted({k for r in rows.values() for k in r})
    print(f"{path}: {len(held)} held-out replies")
    print(f"{'metric':<44}" + "".join(f"{k:>8}" for k in kinds) + f"{'all':>8}{'positions':>11}")
    for name, c in rows.items():
        total = [sum(v[0] for v in c.values()), sum(v[1] for v in c.values())]
        print(f"{name:<44}" + "".join(f"{c[k][0] / c[k][1]:>8.1%}" for k in kinds)
              + f"{total[0] / total[1]:>8.1%}{total[1]:>11}")
    print(f"reported at training: {report['acceptance'][-1]['after']:.1%} over "
          f"{report['acceptance'][-1]['positions']} positions")


if __name__ == "__main__":
    main(sys.argv[1])
