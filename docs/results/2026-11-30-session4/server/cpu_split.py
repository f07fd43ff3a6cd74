import asyncio, os, sys, time, subprocess, json
sys.path.insert(0, "/work/main")
from specserve.bench.online import run_online_point
from specserve.bench.workloads import load_workload
pid = int(sys.argv[1]); conc = int(sys.argv[2]); n = int(sys.argv[3])
tick = os.sysconf("SC_CLK_TCK")
def threads():
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            f = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            out[tid] = (comm, (int(f[11]) + int(f[12])) / tick)
        except FileNotFoundError:
            pass
    return out
items = load_workload("prose")
asyncio.run(run_online_point("http://127.0.0.1:8013", items, 1, 2, max_tokens_cap=8))  # warm
a = threads(); c0 = time.process_time(); t0 = time.perf_counter()
r = asyncio.run(run_online_point("http://127.0.0.1:8013", items, conc, n, max_tokens_cap=64, warm_up=False))
wall = time.perf_counter() - t0; c1 = time.process_time(); b = threads()
by = {}
for tid, (comm, t) in b.items():
    key = "main" if int(tid) == pid else tid
    by[key] = by.get(key, 0) + t - a.get(tid, (comm, 0))[1]
print(f"c={conc} n={n} tok/s {r['output_tok_s']:.0f} wall {wall:.1f}s client_cpu {c1-c0:.2f}s server threads:",
      {k: round(v, 2) for k, v in sorted(by.items(), key=lambda kv: -kv[1])})
