# session 27: run from the repo root, e.g. VARIANTS="main=;yield=SPECSERVE_YIELD:1" CAP=32 ROUNDS=6 python docs/results/2026-12-05-session27/diag.py
"""Where the server's time goes vs offline: steps, tokens/step, forward and step ms, idle."""
import os, sys, time, json, urllib.request, statistics
sys.path.insert(0, "docs/results/2026-12-02-session15")
from _live import launch, wait_healthy
from specserve.bench.online import run_client, run_online_point
from specserve.bench.lab import prepare_workload, run_workload, warm_up
from specserve.bench.workloads import load_workload
from specserve import LLM
C = int(os.environ.get("C", "32")); NP = int(os.environ.get("NP", "64")); CAP = int(os.environ.get("CAP", "32"))
variants = [v.partition("=") for v in os.environ.get("VARIANTS", "main=").split(";")]
servers = {}
for k, (name, _, envs) in enumerate(variants):
    env = dict(kv.split(":", 1) for kv in envs.split(",") if kv)
    servers[name] = (8060 + k, launch(8060 + k, [], env=env, cmd=".venv/bin/python -m specserve.cli serve"))
for port, _ in servers.values():
    wait_healthy(port)
items = load_workload("prose")
llm = LLM(); warm_up(llm.engine)
wl = prepare_workload(llm.engine, "prose", items, cap=CAP)
def st(port): return json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/stats"))
for port, _ in servers.values():
    run_client(run_online_point(f"http://127.0.0.1:{port}", items, 8, 16, max_tokens_cap=CAP, ignore_eos=True))
rows = {}
try:
    for r in range(int(os.environ.get("ROUNDS", "6"))):
        for side in ["offline", *servers]:
            if side == "offline":
                a = llm.engine.get_stats(); t0 = time.perf_counter()
                out = run_workload(llm.engine, wl, C, NP, True, reset_prefix_cache=False)
                wall = time.perf_counter() - t0; b = llm.engine.get_stats()
            else:
                port = servers[side][0]
                a = st(port); t0 = time.perf_counter()
                out = run_client(run_online_point(f"http://127.0.0.1:{port}", items, C, NP, max_tokens_cap=CAP, ignore_eos=True, warm_up=False))
                wall = time.perf_counter() - t0; time.sleep(0.3); b = st(port)
            d = {k: b[k] - a[k] for k in ("num_steps", "num_generated_tokens", "forward_time_s", "step_time_s")}
            rows.setdefault(side, []).append((out["output_tok_s"], wall, d))
finally:
    for _, p in servers.values(): p.terminate()
print(f"c{C} NP{NP} cap{CAP}: medians over rounds")
print(f"{'side':8s} {'tok/s':>7s} {'wall s':>7s} {'steps':>6s} {'tok/step':>8s} {'fwd ms':>7s} {'step ms':>7s} {'idle ms/step':>12s}")
for side, rs in rows.items():
    m = lambda f: statistics.median(f(x) for x in rs)
    print(f"{side:8s} {m(lambda x: x[0]):7.1f} {m(lambda x: x[1]):7.2f} {m(lambda x: x[2]['num_steps']):6.0f} "
          f"{m(lambda x: x[2]['num_generated_tokens'] / x[2]['num_steps']):8.2f} "
          f"{m(lambda x: 1e3 * x[2]['forward_time_s'] / x[2]['num_steps']):7.2f} "
          f"{m(lambda x: 1e3 * x[2]['step_time_s'] / x[2]['num_steps']):7.2f} "
          f"{m(lambda x: 1e3 * (x[1] - x[2]['step_time_s']) / x[2]['num_steps']):12.2f}")
