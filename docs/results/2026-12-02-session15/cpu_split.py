"""CPU seconds by thread during a streamed load against a live server, vs the offline engine."""
import os, sys, time, resource
from _live import launch, wait_healthy
from specserve.bench.online import run_client, run_online_point
from specserve.bench.workloads import load_workload

PORT = 8030
CONC = int(os.environ.get("C", "8")); NPROMPTS = int(os.environ.get("NP", "32"))
srv = launch(PORT, sys.argv[1:], cmd=".venv/bin/specserve serve")
wait_healthy(PORT)
items = load_workload("prose")

def threads(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            f = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            out[tid] = (comm, (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK"), int(f[11]) / 100, int(f[12]) / 100)
        except FileNotFoundError:
            pass
    return out
def ctxsw(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        s = open(f"/proc/{pid}/task/{tid}/status").read()
        v = {l.split(":")[0]: int(l.split()[1]) for l in s.splitlines() if "ctxt_switches" in l}
        out[tid] = (v["voluntary_ctxt_switches"], v["nonvoluntary_ctxt_switches"])
    return out
try:
    run_client(run_online_point(f"http://127.0.0.1:{PORT}", items, CONC, 8, max_tokens_cap=64, ignore_eos=True, warm_up=True))
    for rep in range(2):
        a, ca = threads(srv.pid), ctxsw(srv.pid)
        ru0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter()
        out = run_client(run_online_point(f"http://127.0.0.1:{PORT}", items, CONC, NPROMPTS, max_tokens_cap=64, ignore_eos=True, warm_up=False))
        wall = time.perf_counter() - t0; ru1 = resource.getrusage(resource.RUSAGE_SELF)
        b, cb = threads(srv.pid), ctxsw(srv.pid)
        toks = out["output_tok_s"] * out.get("duration_s", wall)
        print(f"rep {rep}: wall {wall:.2f}s  {out['output_tok_s']:.1f} tok/s  client cpu user {ru1.ru_utime-ru0.ru_utime:.2f} sys {ru1.ru_stime-ru0.ru_stime:.2f}")
        for tid, (comm, cpu, u, s) in sorted(b.items(), key=lambda kv: -(kv[1][1] - a.get(kv[0], ("", 0, 0, 0))[1])):
            d = cpu - a.get(tid, ("", 0))[1]
            vs = cb[tid][0] - ca.get(tid, (0, 0))[0]; nv = cb[tid][1] - ca.get(tid, (0, 0))[1]
            if d > 0.01 or nv > 10:
                print(f"   {tid:>8} {comm:<16} cpu {d:6.2f}s ({d/wall*100:5.1f}% of a core)  vol ctxsw {vs:6d} invol {nv:6d}")
finally:
    srv.terminate(); srv.wait()
