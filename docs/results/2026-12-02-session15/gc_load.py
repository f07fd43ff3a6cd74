import os, subprocess, sys, time, urllib.request, gc
from specserve.bench.online import run_client, run_online_point
from specserve.bench.workloads import load_workload
PORT = 8032
env = {**os.environ, "HF_HUB_OFFLINE": "1", "GCSTATS": "/tmp/gcstats.txt"}
srv = subprocess.Popen([".venv/bin/python", "docs/results/2026-12-02-session15/serve_wrap.py", "--port", str(PORT), "--log-level", "warning"], env=env)
for _ in range(120):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health"); break
    except Exception:
        time.sleep(1)
items = load_workload("prose")
try:
    for c, n in [(1, 8), (8, 64), (32, 256)]:
        t0 = time.perf_counter(); print(time.strftime('%H:%M:%S'), 'start', c)
        out = run_client(run_online_point(f"http://127.0.0.1:{PORT}", items, c, n, max_tokens_cap=32, ignore_eos=True))
        print(c, round(out["output_tok_s"], 1), round(time.perf_counter() - t0, 1), "s")
finally:
    srv.terminate(); srv.wait()
print(open("/tmp/gcstats.txt").read())
