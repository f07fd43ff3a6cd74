import os, sys, gc, time, atexit, threading, collections
si = os.environ.get("SWITCH_INTERVAL")
if si:
    sys.setswitchinterval(float(si))
if os.environ.get("GCSTATS"):
    stats = collections.defaultdict(lambda: [0, 0.0, 0.0])
    t0 = {}
    events = []
    def cb(phase, info):
        if phase == "start":
            t0[threading.get_ident()] = time.perf_counter()
        else:
            d = time.perf_counter() - t0.pop(threading.get_ident(), time.perf_counter())
            s = stats[(threading.current_thread().name, info["generation"])]
            s[0] += 1; s[1] += d; s[2] = max(s[2], d)
            if info["generation"] >= 1:
                events.append((time.time(), info["generation"], d, threading.current_thread().name))
    gc.callbacks.append(cb)
    def dump():
        with open(os.environ["GCSTATS"], "w") as f:
            for k, (n, tot, mx) in sorted(stats.items()):
                f.write(f"{k[0]:20s} gen{k[1]} n={n:6d} total={tot*1e3:9.1f} ms max={mx*1e3:7.2f} ms\n")
            for t, g, d, name in events:
                f.write(f"{time.strftime('%H:%M:%S', time.localtime(t))}.{int(t%1*1000):03d} gen{g} {d*1e3:8.2f} ms {name}\n")
    atexit.register(dump)
    if os.environ.get('GCFREEZE'):
        import specserve.server.api_server as a
hs = os.environ.get("HTTP_SCHED")  # session 16: the HTTP thread's scheduling ("idle" or a nice value)
if hs:
    import uvicorn
    _orig_run = uvicorn.Server.run
    def _run(self, *a, **k):
        tid = threading.get_native_id()
        if hs == "idle":
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        else:
            os.setpriority(os.PRIO_PROCESS, tid, int(hs))
        return _orig_run(self, *a, **k)
    uvicorn.Server.run = _run
from specserve.cli import main
if os.environ.get("NOFREEZE"):
    import specserve.server.api_server as _a
    _a.freeze_startup_heap = lambda: None
sys.argv = ["specserve", "serve"] + sys.argv[1:]
main()
