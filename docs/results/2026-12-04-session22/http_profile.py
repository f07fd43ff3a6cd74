"""py-spy samples of a live server during a streamed c8 load: where the HTTP thread's time goes.
Run from the repo root: python docs/results/2026-12-04-session22/http_profile.py [serve args]"""
import os, subprocess, sys, time
sys.path.insert(0, "docs/results/2026-12-02-session15")
from _live import launch, wait_healthy
from specserve.bench.online import run_client, run_online_point
from specserve.bench.workloads import load_workload

PORT = 8031
CONC = int(os.environ.get("C", "8")); NPROMPTS = int(os.environ.get("NP", "64"))
OUT = os.environ.get("OUT", "/tmp/http_profile.txt")
srv = launch(PORT, sys.argv[1:], cmd=".venv/bin/specserve serve")
wait_healthy(PORT)
items = load_workload("prose")
try:
    url = f"http://127.0.0.1:{PORT}"
    run_client(run_online_point(url, items, CONC, 8, max_tokens_cap=64, ignore_eos=True))
    spy = subprocess.Popen([".venv/bin/py-spy", "record", "-p", str(srv.pid), "-r", "250",
                            "--threads", "-f", "raw", "-o", OUT, "--nonblocking"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    out = run_client(run_online_point(url, items, CONC, NPROMPTS, max_tokens_cap=64,
                                      ignore_eos=True, warm_up=False))
    spy.send_signal(2); spy.wait()
    print(f"{out['output_tok_s']:.1f} tok/s over {NPROMPTS} requests at c{CONC}")
finally:
    srv.terminate(); srv.wait()
