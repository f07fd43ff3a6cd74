"""Does a loaded draft model slow the target's steps when it never runs? Each strategy in a fresh
process, 3 rotated repetitions, prose at concurrency 32, 64 tokens (session 4).

    HF_HUB_OFFLINE=1 .venv/bin/python docs/results/2026-11-30-session4/k0_check.py
"""

import os
from statistics import median

from specserve.bench.lab import Preset, Strategy, run_lab

DRAFT = os.path.expanduser("~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-3")
SPEC = {"method": "draft", "model": DRAFT, "num_speculative_tokens": 4}
OFF = {"enable_prefix_caching": False}
STRATEGIES = [
    Strategy("vanilla", OFF),
    # the KV pool a draft leaves the target (2572 blocks instead of 2912)
    Strategy("vanilla-948MB-kv", {**OFF, "kv_cache_memory": 948142080}),
    Strategy("draft-loaded-off", {**OFF, "speculative_config": SPEC,
                                  "speculation_policy": "off"}),
    Strategy("draft-loaded-adaptive", {**OFF, "speculative_config": SPEC,
                                       "speculation_policy": "adaptive"}),
]

if __name__ == "__main__":  # the lab spawns a process per strategy
    preset = Preset("k0", ("prose",), (32,), max_tokens_cap=64, repeats=3)
    lab = run_lab(STRATEGIES, preset, {"dtype": "bfloat16", "kv_cache_memory": 1 << 30})
    for p in lab.points:
        runs = p["runs"]
        tok_s = [r["output_tok_s"] for r in runs]
        fwd = median(r["forward_time_s"] / r["num_steps"] * 1e3 for r in runs)
        step = median(r["step_time_s"] / r["num_steps"] * 1e3 for r in runs)
        print(f"{p['strategy']:24s} tok/s {median(tok_s):6.0f} {[round(x) for x in tok_s]}  "
              f"forward ms/step {fwd:.2f}  step ms {step:.2f}  K {runs[0].get('spec_k_mean')}")
