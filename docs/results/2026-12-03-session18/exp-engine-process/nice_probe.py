"""Does low-priority CPU work in another process cost the engine less than the same work at
normal priority? A side process burns BUSY_US of CPU every PERIOD_US; offline c8/c32 runs,
interleaved: none / nice 0 / nice 19."""
import os, sys, time, random, statistics, subprocess
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload, warm_up
from specserve.bench.workloads import load_workload
BUSY = os.environ.get("BUSY_US", "300"); PERIOD = os.environ.get("PERIOD_US", "3000")
burner = f"""
import time
b={BUSY}e-6; p={PERIOD}e-6
while True:
    t=time.perf_counter()
    while time.perf_counter()-t<b: pass
    time.sleep(max(p-b,0))
"""
llm = LLM(); warm_up(llm.engine)
items = load_workload("prose"); wl = prepare_workload(llm.engine, "prose", items, cap=32)
rng = random.Random(0); res = {}
for c, n in ((8, 16), (32, 64)):
    for r in range(int(os.environ.get("ROUNDS", "8"))):
        sides = ["none", "nice0", "nice19"]; rng.shuffle(sides)
        for s in sides:
            p = None
            if s != "none":
                p = subprocess.Popen(["nice", "-n", s[4:], sys.executable, "-c", burner])
                time.sleep(0.2)
            out = run_workload(llm.engine, wl, c, n, True, reset_prefix_cache=False)
            if p: p.kill(); p.wait()
            res.setdefault((c, s), []).append(out["output_tok_s"])
    base = res[(c, "none")]
    for s in ("nice0", "nice19"):
        print(c, s, "ratio median", round(statistics.median([a / b for a, b in zip(res[(c, s)], base)]), 3), flush=True)
