"""3-layer draft, json, under adaptive: plans and global rates at concurrency C."""
import os, sys, collections
import numpy as np
from specserve.bench.lab import build_llm, prepare_workload, proposer_config, run_workload, warm_up
from specserve.spec_decode import policy as pol
DRAFT = os.path.expanduser("~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-3")
wl = sys.argv[1]; concs = [int(c) for c in sys.argv[2].split(",")]
llm = build_llm(None, {"speculative_config": proposer_config("draft", 4, draft_model=DRAFT),
                       "speculation_policy": "adaptive", "kv_cache_memory": "2GiB"})
e = llm.engine
warm_up(e)
print("after warm-up global", [round(v, 2) for v in e.spec_policy.acceptance.global_rates])
log = []
orig = pol.choose_num_speculative_tokens
def traced(alphas, k_max, nbt, tc, dc, catch_up, prev, **kw):
    ks, t, g = orig(alphas, k_max, nbt, tc, dc, catch_up, prev, **kw)
    log.append((ks.tolist(), np.round(np.asarray(alphas), 2).tolist(), catch_up.tolist(),
                kw["horizon"].tolist(), round(1e3 * tc(nbt), 1), round(1e3 * float(dc(1)), 2),
                round(1e3 * float(dc(len(ks))), 2)))
    return ks, t, g
pol.choose_num_speculative_tokens = traced
for c in concs:
    log.clear()
    work = prepare_workload(e, wl, cap=32)
    out = run_workload(e, work, c, 4 * c if c > 1 else 8, False, warm_shared_prefix=True)
    print(f"c{c} tok/s", round(out["output_tok_s"], 1), "K", collections.Counter(k for x in log for k in x[0]))
    for x in log[::max(len(log) // 15, 1)]:
        print("  ", x)
    print("global", [round(v, 2) for v in e.spec_policy.acceptance.global_rates])
