import time
from _live import launch, wait_healthy
from specserve.bench.online import run_client, run_online_point
from specserve.bench.workloads import load_workload
PORT = 8032
srv = launch(PORT, env={"GCSTATS": "/tmp/gcstats.txt"})
wait_healthy(PORT)
items = load_workload("prose")
try:
    for c, n in [(1, 8), (8, 64), (32, 256)]:
        t0 = time.perf_counter(); print(time.strftime('%H:%M:%S'), 'start', c)
        out = run_client(run_online_point(f"http://127.0.0.1:{PORT}", items, c, n, max_tokens_cap=32, ignore_eos=True))
        print(c, round(out["output_tok_s"], 1), round(time.perf_counter() - t0, 1), "s")
finally:
    srv.terminate(); srv.wait()
print(open("/tmp/gcstats.txt").read())
