"""In-situ forward time against the start-up profile, by tokens per forward.

The n-gram engine (adaptive policy, so its cost model is profiled and refined as served) runs
closed-loop batches of C requests whose per-request policy is static K (K = 0: off), K rotated
round by round; every target forward is logged with its token count, its measured time, the
profile's unscaled prediction (T_lin + context terms) and the online scale at that moment.
Usage (from the repo root): python docs/results/2026-12-03-session18/slope_insitu.py WORKLOAD C ROUNDS"""
import statistics, sys, time
from collections import defaultdict
from specserve import SamplingParams
from specserve.bench.lab import build_llm, prepare_workload, proposer_config, warm_up
from specserve.bench.workloads import load_workload
from specserve.spec_decode.cost_model import token_context_sum

workload, conc, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = build_llm(None, {"speculative_config": proposer_config("ngram", 4),
                       "speculation_policy": "adaptive"})
e = llm.engine
warm_up(e)
wl = prepare_workload(e, workload, load_workload(workload), cap=32)
pol = e.spec_policy
tc = pol.target_cost
log = []
orig = pol.observe_step

def observe(num_tokens, forward_s, draft_forwards, draft_s, runs=()):
    base = tc.base_context
    sc = sum(max(s + n - base, 0) for s, n in runs)
    tk = sum(token_context_sum(s, n, base) for s, n in runs)
    log.append((K, num_tokens, forward_s, tc.predict(num_tokens, sc, tk) / tc.scale, tc.scale))
    orig(num_tokens, forward_s, draft_forwards, draft_s, runs)
pol.observe_step = observe

prompts = wl.take(conc * 4)
for r in range(rounds):
    for K in ([0, 1, 2, 3, 4] if r % 2 == 0 else [4, 3, 2, 1, 0]):
        params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True,
                                speculation_policy="off" if K == 0 else "static",
                                num_speculative_tokens=K or None)
        todo = list(prompts)
        while todo or e.has_unfinished_requests():
            while todo and len(e.scheduler.running) + len(e.scheduler.waiting) < conc:
                e.add_request(todo.pop()[0], params)
            e.step()

by_n = defaultdict(list)
for K, n, t, p, s in log:
    by_n[n].append((t, p, s))
print(f"{workload} c{conc}, {rounds} rounds; profile T_lin(n) ms:",
      {n: round(1e3 * tc(n) / tc.scale, 2) for n in (1, 2, 4, 6, 8, 10, 12, 16)})
print(" n   forwards  measured ms (median)  profile ms (median)  measured/profile  scale")
rows = []
for n in sorted(by_n):
    v = by_n[n]
    if len(v) < 8 or n > 40:
        continue
    t = statistics.median(x[0] for x in v); p = statistics.median(x[1] for x in v)
    s = statistics.median(x[2] for x in v)
    rows.append((n, t, p))
    print(f"{n:3d} {len(v):9d} {1e3 * t:20.2f} {1e3 * p:20.2f} {t / p:17.3f} {s:6.3f}")
# Least squares of measured on profile over the decode-sized forwards: slope b, intercept a.
import numpy as np
x = np.array([p for _, _, p in rows]); y = np.array([t for _, t, _ in rows])
b, a = np.polyfit(x, y, 1)
print(f"measured = {1e3 * a:.2f} ms + {b:.3f} x profile   (a pure scale would be a = 0)")
