"""One engine with the trained draft loaded: policy off vs adaptive, interleaved (prose, c=32);
then a vanilla engine without a draft. Separates the controller's cost from what loading a draft
costs the target and from engine-instance effects.
Run: HF_HUB_OFFLINE=1 .venv/bin/python docs/results/2026-11-30-session3/k0_check.py"""

import gc
import os

from specserve.bench.lab import build_llm, prepare_workload, run_workload, warm_up

DRAFT = os.path.expanduser(
    "~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-3")
SPEC = {"method": "draft", "model": DRAFT, "num_speculative_tokens": 4}

llm = build_llm(None, {"max_num_seqs": 128, "enable_prefix_caching": False,
                       "speculative_config": SPEC})
warm_up(llm.engine)
workload = prepare_workload(llm.engine, "prose", cap=64)
for r in range(2):
    for policy in ("off", "adaptive"):
        llm.engine.set_speculation_policy(policy, 4)
        res = run_workload(llm.engine, workload, 32, 64)
        print(f"draft engine {policy:9s} round {r}: {res['output_tok_s']:.0f} tok/s, "
              f"forward {res['forward_time_s']:.2f}s, mean K {res['spec_k_mean']}", flush=True)
del llm
gc.collect()
llm = build_llm(None, {"max_num_seqs": 128, "enable_prefix_caching": False})
warm_up(llm.engine)
for r in range(2):
    res = run_workload(llm.engine, workload, 32, 64)
    print(f"vanilla engine round {r}: {res['output_tok_s']:.0f} tok/s, "
          f"forward {res['forward_time_s']:.2f}s", flush=True)
