"""Time of each controller call inside the engine loop (adaptive, n-gram, json, c1 and c4):
wraps the policy's and the engine's methods with perf_counter. Run from the repository root:
    python docs/results/2026-12-01-session8/time_policy.py
(The same calls timed in isolation take 6-8x less: between two forwards the caches are cold.)"""
import time, timeit
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload, warm_up
llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4}, speculation_policy="adaptive")
e = llm.engine; warm_up(e)
wl = prepare_workload(e, "json", cap=32)
pol = e.spec_policy
calls = {}
def wrap(obj, name):
    f = getattr(obj, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); calls.setdefault(name, []).append(time.perf_counter() - t); return r
    setattr(obj, name, g)
for n in ("choose", "observe_step", "observe_verification", "record_choice"):
    wrap(pol, n)
for n in ("_propose", "_look_up", "_set_shadow", "_choose"):
    wrap(e, n)
wrap(e.proposer, "propose")
for conc in (1, 4):
    calls.clear()
    r = run_workload(e, wl, conc, 16, reset_prefix_cache=False)
    n = r["num_steps"]
    print(f"c{conc} steps {n} step {r['step_time_s']/n*1e3:.2f} ms fwd {r['forward_time_s']/n*1e3:.2f}")
    for k, v in calls.items():
        print(f"   {k:22s} {len(v)/n:5.2f} calls/step {sum(v)/n*1e6:7.1f} us/step  {sum(v)/len(v)*1e6:6.1f} us/call")
