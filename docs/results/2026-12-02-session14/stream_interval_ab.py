"""Stream-interval A/B: two servers (interval 1 and N) and the offline engine, rotated rounds."""
import json, statistics, subprocess, sys, time, os, urllib.request
from specserve.bench.online import run_client, run_online_point
from specserve.bench.lab import prepare_workload, run_workload, warm_up
from specserve.bench.workloads import load_workload
from specserve import LLM

N = int(os.environ.get("N", "4")); ROUNDS = int(os.environ.get("ROUNDS", "4"))
CONCS = [int(c) for c in os.environ.get("CONCS", "1,8,32").split(",")]
NP = {1: 24, 8: 32, 16: 48, 32: 64}
servers = {}
for name, port, interval in [("i1", 8020, 1), (f"i{N}", 8021, N)]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    servers[name] = (port, subprocess.Popen([".venv/bin/specserve", "serve", "--port", str(port), "--log-level", "warning", "--stream-interval", str(interval)] + (sys.argv[1:]), env=env))
for name, (port, _) in servers.items():
    for _ in range(120):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health"); break
        except Exception:
            time.sleep(1)
items = load_workload("prose")
llm = LLM()
warm_up(llm.engine)
wl = prepare_workload(llm.engine, "prose", items, cap=64)
res = {}
warmed = set()
try:
    for r in range(ROUNDS):
        for c in CONCS:
            sides = list(servers) + ["offline"]
            sides = sides[r % 3:] + sides[:r % 3]
            for side in sides:
                if side == "offline":
                    out = run_workload(llm.engine, wl, c, NP[c], True, reset_prefix_cache=False)
                else:
                    port = servers[side][0]
                    out = run_client(run_online_point(f"http://127.0.0.1:{port}", items, c, NP[c], max_tokens_cap=64, ignore_eos=True, warm_up=side not in warmed))
                    warmed.add(side)
                res.setdefault((c, side), []).append(out["output_tok_s"])
            print(r, c, {s: round(res[(c, s)][-1], 1) for s in sides}, flush=True)
finally:
    for _, p in servers.values():
        p.terminate()
print("\nconc side median tok/s  runs  per-round ratio to offline (median)")
for c in CONCS:
    off = res[(c, "offline")]
    for side in list(servers) + ["offline"]:
        runs = res[(c, side)]
        ratios = [a / b for a, b in zip(runs, off)]
        print(c, side, round(statistics.median(runs), 1), [round(x) for x in runs], [round(x, 3) for x in ratios], round(statistics.median(ratios), 3))
