"""SIGTERM delivered by tgkill to one thread of an idle server other than the main one (WHICH: its
index among the sorted thread ids, default the last): does the server exit? Session 37."""
import ctypes, glob, os, signal, subprocess, sys, time
sys.path.insert(0, "docs/results/2026-12-02-session15")
from _live import launch, wait_healthy
p = launch(8064, [])
try:
    wait_healthy(8064)
    time.sleep(1)
    tids = sorted(int(t.split("/")[-1]) for t in glob.glob(f"/proc/{p.pid}/task/*"))
    print("threads", tids, flush=True)
    tid = tids[int(os.environ.get("WHICH", "-1"))]
    libc = ctypes.CDLL(None, use_errno=True)
    SYS_tgkill = 234  # x86_64
    print("tgkill", libc.syscall(SYS_tgkill, p.pid, tid, signal.SIGTERM), flush=True)
    t = time.perf_counter()
    try:
        print(f"exited rc={p.wait(timeout=20)} after {time.perf_counter() - t:.1f} s")
    except subprocess.TimeoutExpired:
        print("still alive after 20 s", flush=True)
        os.system(f".venv/bin/py-spy dump --pid {p.pid}")
finally:
    if p.poll() is None:  # whatever happened above, leave no server behind
        p.kill()
