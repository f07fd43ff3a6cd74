"""EAGLE json c1 under adaptive: what the plan sees (rates, catch-up, share) and its goodput per K."""
import os, sys, collections
import numpy as np
from specserve.bench.lab import build_llm, prepare_workload, proposer_config, run_workload, warm_up
from specserve.spec_decode import cost_model as cm
HEAD = os.path.expanduser("~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-eagle")
wl = sys.argv[1] if len(sys.argv) > 1 else "json"
llm = build_llm(None, {"speculative_config": proposer_config("eagle", 4, eagle_model=HEAD),
                       "speculation_policy": "adaptive", "kv_cache_memory": "2GiB"})
e = llm.engine
warm_up(e)
work = prepare_workload(e, wl, cap=32)
log = []
orig = cm._choose_one
def traced(rates, k_max, nbt, tc, dc, catch_up, horizon, prev, hyst, mg, ctx, base_time):
    best, t, g = orig(rates, k_max, nbt, tc, dc, catch_up, horizon, prev, hyst, mg, ctx, base_time)
    # goodput per K without margins
    gs = []
    for k in range(0, k_max + 1):
        b2, t2, g2 = orig(rates, k, nbt, tc, dc, catch_up, horizon, None, 0.0, -1.0, ctx, base_time)
        gs.append(round(g2, 1) if b2 == k else None)
    log.append((best, [round(r, 2) for r in rates], catch_up, horizon, prev, gs,
                round(1e3 * float(tc(nbt)), 2), round(1e3 * float(dc(1)), 2) if dc else None))
    return best, t, g
cm._choose_one = traced
out = run_workload(e, work, 1, 12, False, warm_shared_prefix=True)
print("tok/s", round(out["output_tok_s"], 1))
print("K hist", collections.Counter(x[0] for x in log))
for x in log[::7][:60]:
    print(x)
print("global", [round(v, 2) for v in e.spec_policy.acceptance.global_rates])
