#!/bin/bash
# CPU per streamed token of the load generator (getrusage) and of each server thread
# (/proc/PID/task/TID/stat), at concurrency 32 and 1. Run from the repository root:
#   bash docs/results/2026-12-01-session8/server_cpu_split.sh
export HF_HUB_OFFLINE=1
.venv/bin/python -m specserve.cli serve --port 8035 --log-level warning > /dev/null 2>&1 &
SPID=$!
for i in $(seq 120); do curl -sf http://127.0.0.1:8035/health >/dev/null && break; sleep 0.5; done
.venv/bin/python - <<'PY'
import asyncio, resource, time, os, re, subprocess
from specserve.bench import online
from specserve.bench.workloads import load_workload
spid = int(subprocess.check_output(["pgrep","-f","port 8035"]).split()[0])
def threads():
    out = {}
    for tid in os.listdir(f"/proc/{spid}/task"):
        s = open(f"/proc/{spid}/task/{tid}/stat").read()
        name = s[s.index("(")+1:s.rindex(")")]; f = s[s.rindex(")")+2:].split()
        out[(tid, name)] = (int(f[11]), int(f[12]))
    return out
items = load_workload("prose")
url = "http://127.0.0.1:8035"
asyncio.run(online.run_online_point(url, items, 32, 8, max_tokens_cap=4))
for conc, n in [(32, 128), (1, 24)]:
    t0 = threads(); r0 = resource.getrusage(resource.RUSAGE_SELF)
    r = asyncio.run(online.run_online_point(url, items, conc, n, max_tokens_cap=64, warm_up=False))
    r1 = resource.getrusage(resource.RUSAGE_SELF); t1 = threads()
    ntok = sum(x["output_tokens"] for x in r["requests"])
    print(f"c{conc} tok/s {r['output_tok_s']:.1f} client user {(r1.ru_utime-r0.ru_utime)/ntok*1e6:.1f} sys {(r1.ru_stime-r0.ru_stime)/ntok*1e6:.1f} us/token")
    for k in t1:
        du = (t1[k][0]-t0.get(k,(0,0))[0])*1e4/ntok; ds=(t1[k][1]-t0.get(k,(0,0))[1])*1e4/ntok
        if du+ds > 1: print(f"   server thread {k[1]:20s} user {du:7.1f} sys {ds:6.1f} us/token")
PY
kill -TERM $SPID; wait $SPID
