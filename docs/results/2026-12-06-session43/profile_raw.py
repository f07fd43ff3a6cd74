"""The start-up profile's raw small points, the way the engine takes them: the old way (each
point the fastest of a warm-up and up to 3 runs, ascending) against _small_points (passes over
all of them, the first point's fastest time times each point's median ratio within a pass).
Three attempts each, alternated; then what the fitted curve prices T(n) / T(1) at in a whole
profile_forward, three times. Printed: T(n) / T(1)."""
import time
import torch
from specserve.bench.lab import build_llm, warm_up
from specserve.spec_decode import profiler
from specserve.spec_decode.profiler import _fake_seq, _fastest, _small_points

POINTS = [n for n in profiler.PROFILE_POINTS if n <= profiler.SMALL_POINTS_MAX]
llm = build_llm(None, {"enable_prefix_caching": True, "max_num_seqs": 128})
eng = llm.engine
warm_up(eng)
runner = eng.runner
shapes = [[(_fake_seq(runner, i, 96), 1) for i in range(n)] for n in POINTS]

def fmt(label, times, took):
    print(f"  {label:16s}" + " ".join(f"{n}:{t / times[0]:.3f}" for n, t in zip(POINTS, times))
          + f"   T(1) {1e3 * times[0]:.2f} ms  ({took:.2f} s)", flush=True)

for attempt in range(3):
    t0 = time.perf_counter()
    old = [_fastest(runner, s, torch.arange(n), 3) for n, s in zip(POINTS, shapes)]
    t1 = time.perf_counter()
    new = _small_points(runner, shapes)
    t2 = time.perf_counter()
    print(f"attempt {attempt}")
    fmt("point by point", old, t1 - t0)
    fmt("in passes", new, t2 - t1)
for attempt in range(3):
    t0 = time.perf_counter()
    cost = profiler.profile_forward(runner)
    print(f"profile_forward {attempt} ({time.perf_counter() - t0:.1f} s), fitted T(n) / T(1): "
          + " ".join(f"{n}:{cost(n) / cost(1):.3f}" for n in (1, 2, 3, 4, 5, 6, 8, 12, 16, 17)),
          flush=True)
