"""Adaptive (n-gram, K_max 4) at C requests of WORKLOAD: the engine's speculation work per step
(spec_time) and the time of each piece (plan, look-ups, observe), by wrapping the methods. As
saved it wraps the planner (591fb12 on); before the move the same wrapped engine._choose and
engine._set_shadow."""
import os, time, collections
from specserve import LLM
from specserve.bench.lab import prepare_workload, proposer_config, run_workload, warm_up
C = int(os.environ.get("C", 8)); WORKLOAD = os.environ.get("WORKLOAD", "prose")
llm = LLM(speculative_config=proposer_config("ngram", 4), speculation_policy="adaptive",
          enable_prefix_caching=True, max_num_seqs=128)
e = llm.engine; warm_up(e)
w = prepare_workload(e, WORKLOAD, cap=32)
acc = collections.defaultdict(lambda: [0, 0.0])
def wrap(obj, name, label):
    f = getattr(obj, name)
    def g(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally:
            s = acc[label]; s[0] += 1; s[1] += time.perf_counter() - t
    setattr(obj, name, g)
wrap(e.proposer, "propose", "proposer.propose")
wrap(e.spec_policy, "choose", "policy.choose")
for n in ("_choose", "_set_shadow"):
    wrap(e.planner, n, "planner." + n)
for n in dir(e.spec_policy):
    if n.startswith("observe"): wrap(e.spec_policy, n, "policy." + n)
run_workload(e, w, C, 16, warm_shared_prefix=True)
acc.clear()
run = run_workload(e, w, C, 64, warm_shared_prefix=True)
n = run["num_steps"]
print(f"steps {n}, spec_time {run['spec_time_s']/n*1e3:.3f} ms/step, forward {run['forward_time_s']/n*1e3:.2f} ms/step, drafts {run['num_draft_tokens']}")
for k, (c, t) in sorted(acc.items(), key=lambda kv: -kv[1][1]):
    print(f"  {k:28s} calls {c:5d}  {t/n*1e3:.3f} ms/step  {t/c*1e6:.1f} us/call")
