"""Offline loop vs the server's AsyncEngine driven in-process (no HTTP, no client process),
alternating. Isolates the AsyncEngine hand-off from HTTP + client costs.
    python docs/results/2026-12-01-session8/async_probe.py CONCURRENCY NUM_PROMPTS"""
import asyncio, sys, threading, time
from specserve import LLM, SamplingParams
from specserve.bench.lab import prepare_workload, run_workload, warm_up
from specserve.server.async_engine import AsyncEngine

KEYS = ["num_steps", "num_generated_tokens", "forward_time_s", "step_time_s"]

def show(tag, b, a, ntok, wall):
    d = {k: a[k] - b[k] for k in KEYS}; n = d["num_steps"]
    print(f"{tag:8s} tok/s {ntok / wall:7.1f} steps {n} tok/step {d['num_generated_tokens']/n:.2f} "
          f"fwd {d['forward_time_s']/n*1e3:.2f} step {d['step_time_s']/n*1e3:.2f} "
          f"wall {wall/n*1e3:.2f} ms/step", flush=True)

def run_async(engine, wl, c, n):
    ae = AsyncEngine(engine, own_thread=False)
    result = {}
    async def client():
        ae.start()
        todo = iter(range(n)); ntok = 0
        async def worker():
            nonlocal ntok
            for i in todo:
                prompt, mt = wl.prompts[i % len(wl.prompts)], wl.max_tokens[i % len(wl.prompts)]
                s = await ae.add_requests([f"r{i}-{time.time()}"], [prompt],
                                          [SamplingParams(temperature=0.0, max_tokens=mt)], stream=True)
                last = None
                async for _, out in s:
                    last = out
                ntok += len(last.outputs[0].token_ids)
        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(c)))
        result["wall"] = time.perf_counter() - t; result["ntok"] = ntok
        await ae.shutdown()
    th = threading.Thread(target=lambda: asyncio.run(client()), daemon=True); th.start()
    ae.run_in_current_thread(is_alive=th.is_alive)
    th.join()
    return result["ntok"], result["wall"]

if __name__ == "__main__":
    c, n = int(sys.argv[1]), int(sys.argv[2])
    llm = LLM(); e = llm.engine; warm_up(e)
    wl = prepare_workload(e, "prose", cap=64)
    run_async(e, wl, c, 4)
    for r in range(3):
        b = e.get_stats(); ntok, wall = run_async(e, wl, c, n); show("async", b, e.get_stats(), ntok, wall)
        b = e.get_stats(); res = run_workload(e, wl, c, n, reset_prefix_cache=False)
        show("offline", b, e.get_stats(), res["output_tokens"] if "output_tokens" in res else sum(x["output_tokens"] for x in res["requests"]), res["wall_s"])
