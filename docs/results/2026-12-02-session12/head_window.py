"""Held-out first-guess agreement of a trained EAGLE head, teacher-forced, when the head reads
the whole context (as served until session 12) against only the last W prompt positions before
the reply (as it is trained, `head_context`). Held-out prompts: the train-draft split (seed 0).

    python head_window.py HEAD_DIR [W ...]
"""
import sys
import time

import torch

from specserve.llm import LLM
from specserve.models.llama import build_model
from specserve.models.loader import load_model
from specserve.layers.linear import pack_linears
from specserve.spec_decode.eagle_io import load_eagle
from specserve.train.data import DataConfig, generate_samples, split_by_kind, workload_prompts
from specserve.train.eagle import agreement, featurize

head_dir, windows = sys.argv[1], [int(w) for w in sys.argv[2:]] or [16, 64, 256]
items = workload_prompts("prose,json,sql,rag")
cfg = DataConfig()
_, held_items = split_by_kind(items, cfg.held_out_fraction, 0)
llm = LLM(seed=0)
t0 = time.perf_counter()
held = generate_samples(llm, held_items, cfg.max_reply_tokens)
print(f"{len(held)} held-out replies in {time.perf_counter() - t0:.0f} s", flush=True)
del llm
loaded = load_model(None)
model = build_model(loaded.config, loaded.state_dict, torch.float32).requires_grad_(False)
teacher = build_model(loaded.config, loaded.state_dict, torch.bfloat16).requires_grad_(False)
pack_linears(teacher)  # the target as served, as train-draft's teacher pass runs it
head = load_eagle(head_dir, loaded.config, model.embed_tokens, model.lm_head.weight,
                  torch.float32)
rows = []
for w in [None, *windows]:
    feats = featurize(teacher, held, None, head.feature_layers, w)
    with torch.no_grad():
        counts = agreement(head, feats)
    kinds = {k: c[0] / c[1] for k, c in counts.items()}
    total = sum(c[0] for c in counts.values()) / sum(c[1] for c in counts.values())
    rows.append((w, kinds, total))
    print(f"window {str(w):>5}: all {total:.1%}  " + "  ".join(
        f"{k} {v:.1%}" for k, v in kinds.items()), flush=True)
