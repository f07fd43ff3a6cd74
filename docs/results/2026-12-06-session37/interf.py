"""Offline engine at concurrency C with and without a periodic CPU interferer (a process that
wakes every PERIOD_MS and spins SPIN_US), rotated round by round; prints tok/s per side and the
median per-round ratio (with / without)."""
import os, statistics, time, multiprocessing as mp

def interferer(flag, period_s, spin_s):
    nxt = time.perf_counter()
    while flag.value >= 0:
        nxt += period_s
        if flag.value == 1:
            t = time.perf_counter() + spin_s
            while time.perf_counter() < t:
                pass
        d = nxt - time.perf_counter()
        if d > 0: time.sleep(d)
        else: nxt = time.perf_counter()

if __name__ == "__main__":
    flag = mp.Value("i", 0)
    proc = mp.Process(target=interferer, args=(flag, float(os.environ.get("PERIOD_MS", "14")) / 1e3,
                                               float(os.environ.get("SPIN_US", "400")) / 1e6))
    proc.start()
    from specserve import LLM
    from specserve.bench.lab import prepare_workload, run_workload, warm_up
    from specserve.bench.workloads import load_workload
    C = int(os.environ.get("C", "1")); NP = int(os.environ.get("NP", "4")); ROUNDS = int(os.environ.get("ROUNDS", "10"))
    llm = LLM(); warm_up(llm.engine)
    wl = prepare_workload(llm.engine, "prose", load_workload("prose"), cap=32)
    res = {0: [], 1: []}
    for r in range(ROUNDS):
        for side in ((0, 1) if r % 2 else (1, 0)):
            flag.value = side
            res[side].append(run_workload(llm.engine, wl, C, NP, True, reset_prefix_cache=False)["output_tok_s"])
    flag.value = -1; proc.join()
    ratios = [b / a for a, b in zip(res[0], res[1])]
    print(f"C={C} quiet {statistics.median(res[0]):.1f} tok/s, interfered {statistics.median(res[1]):.1f} tok/s, ratio median {statistics.median(ratios):.3f} {sorted(round(x,3) for x in ratios)}")
