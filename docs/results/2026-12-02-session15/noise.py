import time, os
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload, warm_up
from specserve.bench.workloads import load_workload
def steal():
    f = open("/proc/stat").readline().split()
    return int(f[8]) / os.sysconf("SC_CLK_TCK")
llm = LLM(); warm_up(llm.engine)
items = load_workload("prose")
wl = prepare_workload(llm.engine, "prose", items, cap=32)
t_end = time.time() + 120
while time.time() < t_end:
    s0 = steal(); t0 = time.perf_counter()
    out = run_workload(llm.engine, wl, 8, 16, True, reset_prefix_cache=False)
    w = time.perf_counter() - t0
    print(f"{time.strftime('%H:%M:%S')} {out['output_tok_s']:6.1f} tok/s  wall {w:.2f}s steal {(steal()-s0)/w*100:5.1f}%", flush=True)
