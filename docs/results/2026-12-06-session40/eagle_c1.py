"""Why does adaptive-eagle draft so little on unseen prose at c1 while static K=1 pays?"""
import collections, os, sys
import numpy as np
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload
from specserve.bench.trained import unseen_items
import specserve.spec_decode.policy as pol
head = os.path.expanduser("~/.cache/specserve/drafts/s39-eagle")
llm = LLM(speculative_config={"method": "eagle", "model": head, "num_speculative_tokens": 4},
          speculation_policy="adaptive", kv_cache_memory=1 << 30)
eng = llm.engine
items = unseen_items("prose", [head])
print(len(items), "unseen prompts")
wl = prepare_workload(eng, "prose", items, cap=64, scale=1.0)
run_workload(eng, wl, 1, 2)
log = []
orig = pol.choose_num_speculative_tokens
def wrapped(alphas, k_max, n_base, tc, dc, catch_up, prev, **kw):
    r = orig(alphas, k_max, n_base, tc, dc, catch_up, prev, **kw)
    log.append((np.asarray(alphas).copy(), r[0].copy(), catch_up.copy()))
    return r
pol.choose_num_speculative_tokens = wrapped
for k in sys.argv[1:] or ("off", 1, "adaptive", "off", 1, "adaptive"):
    eng.set_speculation_policy(k, 4) if isinstance(k, str) and not k.isdigit() else eng.set_speculation_policy("static", int(k))
    log.clear()
    x = run_workload(eng, wl, 1, 10)
    print(f"K={k} tok/s {x['output_tok_s']:.1f} steps {x['num_steps']} fwd/step {1e3*x['forward_time_s']/x['num_steps']:.2f} ms draft {1e3*x.get('draft_time_s',0):.0f} ms K mean {x['spec_k_mean']:.2f} acc {x['acceptance_rate'] or 0:.2f}", flush=True)
    if log:
        ks = np.array([l[1][0] for l in log]); a = np.array([l[0][0] for l in log])
        print("   plans", len(log), "K hist", collections.Counter(ks.tolist()), "alpha1 mean %.3f [%.3f-%.3f]" % (a[:,0].mean(), a[:,0].min(), a[:,0].max()), "alpha2 mean %.3f" % a[:,1].mean(), "catch-up mean %.2f" % np.mean([l[2][0] for l in log]))
        pol_ = eng.spec_policy
        tc, dc = pol_.target_cost, pol_.draft_cost
        print("   target cost 1/2/5 tok ms", [round(1e3*float(tc(n)),2) for n in (1,2,5)], "draft cost 1 fwd ms", round(1e3*float(dc.forward_time(1,1)),2) if dc is not None else dc)
        print("   global rates", np.round(pol_.acceptance.global_rates, 3))
