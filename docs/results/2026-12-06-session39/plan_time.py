"""Per-step time of adaptive n-gram's bookkeeping pieces (no profiler), prose."""
import sys, time
from collections import defaultdict
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload
import specserve.engine.spec_planner as sp
import specserve.spec_decode.policy as pol
import specserve.spec_decode.cost_model as cm

acc = defaultdict(float); cnt = defaultdict(int)
def wrap(obj, name, label):
    f = getattr(obj, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[label] += time.perf_counter() - t; cnt[label] += 1; return r
    setattr(obj, name, g)
wrap(sp.SpeculationPlanner, "propose", "propose")
wrap(sp.SpeculationPlanner, "_look_up", "look_up")
wrap(pol.AdaptivePolicy, "choose", "policy.choose")
wrap(pol, "choose_num_speculative_tokens", "choose_num")
wrap(pol.AdaptivePolicy, "observe_step", "observe_step")
wrap(pol.SpecPolicy, "observe_verification", "observe_verif")
import specserve.spec_decode.acceptance as ac
wrap(ac.AcceptanceTracker, "lower_estimates", "lower_est")
wrap(ac.AcceptanceTracker, "relax", "relax")
c = int(sys.argv[1])
llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4},
          speculation_policy=sys.argv[2] if len(sys.argv) > 2 else "adaptive", kv_cache_memory=1 << 30)
eng = llm.engine
wl = prepare_workload(eng, "prose", cap=32, scale=1.0)
for _ in range(2):
    run_workload(eng, wl, c, 4 * c, warm_shared_prefix=True)
acc.clear(); cnt.clear()
r = run_workload(eng, wl, c, 8 * c, warm_shared_prefix=True)
n = r["num_steps"]
print(f"c={c} steps {n} step {1e3*r['step_time_s']/n:.2f} ms fwd {1e3*r['forward_time_s']/n:.2f} spec {1e3*r['spec_time_s']/n:.3f} ms/step drafts {r['num_draft_tokens']}")
for k in acc: print(f"  {k:15s} {1e3*acc[k]/n:.3f} ms/step  calls {cnt[k]}  {1e6*acc[k]/max(cnt[k],1):.0f} us/call")
