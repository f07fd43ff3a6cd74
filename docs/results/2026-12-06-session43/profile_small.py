"""The start-up profile's small points (n sequences x 1 token, n <= 16), measured three ways,
three times each: as the profile does (ascending, each point's runs back to back, the fastest of
a warm-up and up to 3 runs within 0.25 s), and round-robin over the points for PASSES passes (the
median, and the fastest, of each point's forwards). Printed: T(n) / T(1)."""
import os, statistics, time
import torch
from specserve.bench.lab import build_llm, warm_up
from specserve.spec_decode.profiler import _fake_seq, _fastest

PASSES = int(os.environ.get("PASSES", "12"))
POINTS = (1, 2, 3, 4, 6, 8, 12, 16)
llm = build_llm(None, {"enable_prefix_caching": True, "max_num_seqs": 128})
eng = llm.engine
warm_up(eng)
runner = eng.runner
shapes = {n: [(_fake_seq(runner, i, 96), 1) for i in range(n)] for n in POINTS}
inputs = {n: runner.prepare(s) for n, s in shapes.items()}

def fmt(label, times):
    print(f"  {label:22s}" + " ".join(f"{n}:{times[n] / times[1]:.3f}" for n in POINTS)
          + f"   T(1) {1e3 * times[1]:.2f} ms", flush=True)

for attempt in range(3):
    print(f"attempt {attempt}")
    t0 = time.perf_counter()
    fmt("profile (fastest)", {n: _fastest(runner, shapes[n], torch.arange(n), 3) for n in POINTS})
    t1 = time.perf_counter()
    runs = {n: [] for n in POINTS}
    for p in range(PASSES):
        for n in POINTS:
            t = time.perf_counter()
            runner.execute(inputs[n], torch.arange(n))
            runs[n].append(time.perf_counter() - t)
    t2 = time.perf_counter()
    fmt("round-robin median", {n: statistics.median(v) for n, v in runs.items()})
    fmt("round-robin fastest", {n: min(v) for n, v in runs.items()})
    print(f"  took {t1 - t0:.2f} s / {t2 - t1:.2f} s")
