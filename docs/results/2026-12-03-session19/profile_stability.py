"""How much the start-up profile moves from one profiling to the next, old (b94e777) against
new, alternating on one engine, and what the plans made on each say at a few batch sizes and
acceptances. Usage (from the repo root):
  python docs/results/2026-12-03-session19/profile_stability.py REPEATS"""
import sys, time
from collections import Counter
import numpy as np
from specserve.bench.lab import build_llm, proposer_config, warm_up
from specserve.spec_decode.cost_model import StepCostModel, choose_num_speculative_tokens
from specserve.spec_decode.profiler import profile_forward

sys.path.insert(0, "docs/results/2026-12-03-session19")
from ab_profile_old import old_profiler  # noqa: E402

repeats = int(sys.argv[1])
llm = build_llm(None, {"speculative_config": proposer_config("ngram", 4),
                       "speculation_policy": "off"})
e = llm.engine
warm_up(e)
ns = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16)
cases = [(1, 0.2), (2, 0.3), (2, 0.6), (4, 0.3), (4, 0.4), (5, 0.3), (6, 0.4)]
prof = {"old": old_profiler().profile_forward, "new": profile_forward}
curves = {k: [] for k in prof}
plans = {k: {c: Counter() for c in cases} for k in prof}
secs = {k: [] for k in prof}
for r in range(repeats):
    for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
        t0 = time.perf_counter()
        m = prof[name](e.runner)
        secs[name].append(time.perf_counter() - t0)
        m = StepCostModel(m.x.tolist(), m.y.tolist())
        curves[name].append([1e3 * m(n) for n in ns])
        for c, a in cases:
            ks = choose_num_speculative_tokens(np.full(c, a), np.full(c, 4), c, m)[0]
            plans[name][(c, a)][str(sorted(ks.tolist(), reverse=True))] += 1
for name in prof:
    v = np.array(curves[name])
    print(f"== {name} profile, {repeats} times, {np.median(secs[name]):.1f} s each (median)")
    print("  n       " + " ".join(f"{n:6d}" for n in ns))
    for label, row in (("min", v.min(0)), ("median", np.median(v, 0)), ("max", v.max(0))):
        print(f"  {label:7} " + " ".join(f"{x:6.2f}" for x in row))
    for i, curve in enumerate(v):
        print(f"  run {i}   " + " ".join(f"{x:6.2f}" for x in curve))
    print("  plans (batch, acceptance): counts of each plan over the profiles")
    for c in cases:
        print(f"    {c}: {dict(plans[name][c])}")
