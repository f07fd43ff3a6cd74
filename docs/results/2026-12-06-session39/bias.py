import sys
import numpy as np
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload
import specserve.spec_decode.policy as pol
from specserve.spec_decode.cost_model import level_gains
pred = {"acc": 0.0, "drafts": 0, "plans": 0, "a1": []}
orig = pol.choose_num_speculative_tokens
def wrapped(alphas, k_max, *a, **k):
    r = orig(alphas, k_max, *a, **k)
    ks = r[0]
    if ks.sum():
        g = level_gains(alphas, int(ks.max()))
        for i, kk in enumerate(ks):
            if kk:
                pred["acc"] += float(g[i, :kk].sum()); pred["drafts"] += int(kk); pred["a1"].append(np.asarray(alphas)[i].tolist())
        pred["plans"] += 1
    return r
pol.choose_num_speculative_tokens = wrapped
c = int(sys.argv[1]); wname = sys.argv[2] if len(sys.argv) > 2 else "prose"
llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4}, speculation_policy="adaptive", kv_cache_memory=1 << 30)
eng = llm.engine
wl = prepare_workload(eng, wname, cap=32, scale=1.0)
for r in range(4):
    pred.update(acc=0.0, drafts=0, plans=0, a1=[])
    x = run_workload(eng, wl, c, 4 * c, warm_shared_prefix=True)
    print(f"round {r}: drafts {x['num_draft_tokens']} accepted {x['num_accepted_tokens']} | planned drafts {pred['drafts']} predicted accepted {pred['acc']:.1f} in {pred['plans']} plans; mean alphas of drafting requests {np.round(np.mean(pred['a1'],axis=0),2) if pred['a1'] else None}; global {np.round(eng.spec_policy.acceptance.global_rates,2)}", flush=True)
