"""CPU time of each server thread and of this client over one closed-loop online run.
Usage: cpu_split.py SERVER_PID CONCURRENCY NUM_PROMPTS (server on 127.0.0.1:8013)."""

import asyncio
import os
import sys
import time

from specserve.bench.online import run_online_point
from specserve.bench.workloads import load_workload

URL = "http://127.0.0.1:8013"


def thread_cpu(pid: int) -> dict[str, float]:
    """Seconds of user + system time per thread id (from /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        out["main" if int(tid) == pid else tid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def main() -> None:
    pid, conc, n = (int(x) for x in sys.argv[1:4])
    items = load_workload("prose")
    asyncio.run(run_online_point(URL, items, 1, 2, max_tokens_cap=8))  # warm-up
    before, cpu0, t0 = thread_cpu(pid), time.process_time(), time.perf_counter()
    r = asyncio.run(run_online_point(URL, items, conc, n, max_tokens_cap=64, warm_up=False))
    wall, cpu1, after = time.perf_counter() - t0, time.process_time(), thread_cpu(pid)
    used = {k: round(v - before.get(k, 0.0), 2) for k, v in after.items()}
    busy = dict(sorted(((k, v) for k, v in used.items() if v > 0), key=lambda kv: -kv[1]))
    print(f"c={conc} n={n} tok/s {r['output_tok_s']:.0f} wall {wall:.1f}s "
          f"client_cpu {cpu1 - cpu0:.2f}s server threads: {busy}")


if __name__ == "__main__":
    main()
