import os, collections
import numpy as np
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload
from specserve.bench.trained import unseen_items
import specserve.spec_decode.cost_model as cm
head = os.path.expanduser("~/.cache/specserve/drafts/s39-eagle")
llm = LLM(speculative_config={"method": "eagle", "model": head, "num_speculative_tokens": 4},
          speculation_policy="adaptive", kv_cache_memory=1 << 30)
eng = llm.engine
wl = prepare_workload(eng, "prose", unseen_items("prose", [head]), cap=64, scale=1.0)
run_workload(eng, wl, 1, 2)
log = []; glog = []
orig = cm._choose_one
def wrapped(rates, k_max, nb, tc, dc, catch_up, horizon, prev, hyst, mg, ctx, base_time):
    r = orig(rates, k_max, nb, tc, dc, catch_up, horizon, prev, hyst, mg, ctx, base_time)
    t1 = tc(nb + 1) - tc(nb); d1 = dc(1)
    cu = float(dc.extra_tokens_time(1, catch_up - 1)) if catch_up > 1 else 0.0
    g0 = 1 / base_time; g1 = (1 + rates[0]) / (base_time + t1 + d1 + cu * min((1 + sum(np.cumprod(rates[:k_max]))) / max(horizon or 1, 1), 1))
    A = eng.spec_policy.acceptance
    glog.append((A.global_succ[0] / A.global_trials[0], A.global_trials[0], A.prior_weight))
    log.append((r[0], rates[0], rates[1], catch_up, horizon, base_time * 1e3, t1 * 1e3, d1 * 1e3, cu * 1e3, g1 / g0))
    return r
cm._choose_one = wrapped
import specserve.spec_decode.policy as P
P._PROBE = False
eng.set_speculation_policy("adaptive", 4)
x = run_workload(eng, wl, 1, 10)
print("tok/s", x["output_tok_s"], "K mean", x["spec_k_mean"])
a = np.array(log)
print("plans", len(a), "K>0", int((a[:, 0] > 0).sum()))
import specserve.spec_decode.policy as P
print("cols: K a1 a2 catch_up horizon base_ms tok_ms draft_ms catchup_ms gain1")
k0 = a[a[:,0]==0]; k1 = a[a[:,0]>0]
print("K=0 plans", len(k0), "a1 quantiles", np.round(np.quantile(k0[:,1], [0.1,0.5,0.9]),3) if len(k0) else None, "gain1 q", np.round(np.quantile(k0[:,9], [0.1,0.5,0.9]),3) if len(k0) else None, "catch-up mean", k0[:,3].mean() if len(k0) else None)
print("K>0 plans", len(k1), "a1 quantiles", np.round(np.quantile(k1[:,1], [0.1,0.5,0.9]),3), "gain1 q", np.round(np.quantile(k1[:,9], [0.1,0.5,0.9]),3), "catch-up mean", k1[:,3].mean())
print("K=0 with gain1 > 1.03:", int((k0[:,9] > 1.03).sum()))
print("means", " ".join(f"{v:7.3f}" for v in a.mean(0)))

g = np.array(glog)
print("global rate over the run (every 50th plan):", np.round(g[::50, 0], 3), "trials", np.round(g[::50, 1], 1), "w", g[::50, 2])
