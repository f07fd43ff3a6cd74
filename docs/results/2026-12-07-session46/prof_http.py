import os, sys, time, subprocess
sys.path.insert(0, "docs/results/2026-12-02-session15")
from _live import launch, wait_healthy
from specserve.bench.online import run_client, run_online_point
from specserve.bench.workloads import load_workload
p = launch(8062, os.environ.get("ARGS", "").split()); wait_healthy(8062)
items = load_workload("prose")
run_client(run_online_point("http://127.0.0.1:8062", items, 8, 16, max_tokens_cap=32, ignore_eos=True))
pids = [p.pid] + [int(x) for x in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()]
spy = subprocess.Popen([".venv/bin/py-spy", "record", "-r", "400", "-d", "25", "-f", "raw", "--threads", "--nonblocking", "-p", str(pids[-1]), "-o", os.environ.get("OUT", "/tmp/prof.txt")])
t = time.time(); n = 0
while time.time() - t < 24:
    out = run_client(run_online_point("http://127.0.0.1:8062", items, 32, 64, max_tokens_cap=32, ignore_eos=True, warm_up=False)); n += out["output_tokens"]
print("tokens", n)
spy.wait(); p.terminate(); p.wait()
