import os, sys, time, glob
sys.path.insert(0, "docs/results/2026-12-02-session15")
from _live import launch, wait_healthy
from specserve.bench.online import run_client, run_online_point
from specserve.bench.workloads import load_workload
C = int(os.environ.get("C", "1")); NP = int(os.environ.get("NP", "16"))
p = launch(8061, os.environ.get("ARGS", "").split()); wait_healthy(8061)
items = load_workload("prose")
run_client(run_online_point("http://127.0.0.1:8061", items, 8, 16, max_tokens_cap=32, ignore_eos=True))
import subprocess
def threads(pid):
    out = {}
    for t in glob.glob(f"/proc/{pid}/task/*"):
        try:
            s = open(t + "/stat").read(); name = open(t + "/comm").read().strip()
        except OSError: continue
        f = s[s.rindex(")") + 2:].split()
        out[t.split("/")[-1] + ":" + name] = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return out
# the server's python process may be a child of the wrapper
pids = [p.pid] + [int(x) for x in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()]
for rep in range(3):
    before = {pid: threads(pid) for pid in pids}
    c0 = time.process_time(); w0 = time.perf_counter()
    out = run_client(run_online_point("http://127.0.0.1:8061", items, C, NP, max_tokens_cap=32, ignore_eos=True, warm_up=False))
    c1 = time.process_time(); w1 = time.perf_counter()
    after = {pid: threads(pid) for pid in pids}
    n = out["output_tokens"]
    print(f"rep {rep}: {n} tokens, {out['output_tok_s']:.1f} tok/s, wall {w1-w0:.2f} s, client CPU {(c1-c0)/n*1e6:.0f} us/token")
    for pid in pids:
        d = {k: after[pid].get(k, 0) - v for k, v in before[pid].items()}
        for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:6]:
            if v > 0: print(f"   {pid} {k:30s} {v/n*1e6:8.0f} us/token")
t = time.perf_counter(); p.terminate()
try:
    print(f"server exited rc={p.wait(timeout=90)} {time.perf_counter() - t:.1f} s after SIGTERM")
except subprocess.TimeoutExpired:
    print("server still alive 90 s after SIGTERM:", flush=True)
    os.system(f".venv/bin/py-spy dump --pid {p.pid}")
    p.kill()
