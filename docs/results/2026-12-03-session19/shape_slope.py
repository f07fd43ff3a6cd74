"""Target forward time by shape, S sequences x q tokens (logits for every token, as a
verification needs), shuffled, 60 runs each: does a verification token cost what the start-up
profile's n-sequences x 1-token curve says? Median and p10 per shape, next to the profile's
raw fastest-of-3 points and its fitted curve.
Usage (from the repo root): python docs/results/2026-12-03-session19/shape_slope.py [CONTEXT]"""
import random, statistics, sys, time
import torch
from specserve.bench.lab import build_llm, proposer_config
from specserve.spec_decode import profiler as P

ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 160
llm = build_llm(None, {"speculative_config": proposer_config("ngram", 4),
                       "speculation_policy": "adaptive"})
e = llm.engine
tc = e.spec_policy.target_cost
t = e.runner
raw = {n: P._fastest(t, [(P._fake_seq(t, i, 96), 1) for i in range(n)], torch.arange(n), 3)
       for n in (1, 2, 3, 4, 6, 8, 12, 16)}
shapes = [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1), (10, 1), (12, 1),
          (1, 3), (1, 5), (2, 2), (2, 3), (2, 4), (2, 5), (3, 2), (4, 2), (4, 3), (6, 2)]
prepared = {s: t.prepare([(P._fake_seq(t, i, ctx, s[1]), s[1]) for i in range(s[0])])
            for s in shapes}
times = {s: [] for s in shapes}
keys = shapes * 60
random.seed(0)
random.shuffle(keys)
for s in keys:
    t0 = time.perf_counter()
    t.execute(prepared[s], torch.arange(s[0] * s[1]))
    times[s].append(time.perf_counter() - t0)
print(f"context {ctx}; profile fit (scale {tc.scale:.3f}) and raw fastest-of-3 at context 96:")
print("  " + "  ".join(f"T({n})={1e3 * tc(n) / tc.scale:.2f}/{1e3 * raw[n]:.2f}" for n in raw))
print(" seqs x q = n   median ms   p10 ms")
for s in sorted(shapes, key=lambda s: (s[0] * s[1], -s[0])):
    v = sorted(times[s])
    print(f"{s[0]:4d} x {s[1]} = {s[0] * s[1]:2d} {1e3 * statistics.median(v):10.2f} {1e3 * v[len(v) // 10]:8.2f}")
