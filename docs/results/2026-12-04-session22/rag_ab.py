"""Waiting for in-flight shared prefixes, on and off, alternated in one engine (prefix caching on,
as the engine's default; cold cache at the start of every run). rag closed loop at each
concurrency (2 x c prompts, replies capped at 64 tokens), and one 2.5k-token rag prompt sampled
4 times at once (what n=4 sends the engine). Per point: median over rounds.
python docs/results/2026-12-04-session22/rag_ab.py [ROUNDS] [C,C,...]"""
import random, statistics, sys, time
from specserve import LLM, SamplingParams
from specserve.bench.lab import prepare_workload, run_workload
from specserve.engine import scheduler

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
CONCS = [int(c) for c in (sys.argv[2] if len(sys.argv) > 2 else "4,8,16,32").split(",")]
WAIT = scheduler.MIN_SHARED_TOKENS_TO_WAIT
llm = LLM(kv_cache_memory=1 << 30)
eng = llm.engine
wl = prepare_workload(eng, "rag", cap=64)
rows: dict = {}


def counters():
    s = eng.get_stats()
    return s["num_prompt_tokens"], s["num_preemptions"]


def n4() -> dict:
    eng.block_manager.reset_prefix_cache()
    p0, _ = counters(); t0 = time.perf_counter()
    params = [SamplingParams(temperature=1.0, seed=j, max_tokens=32, ignore_eos=True)
              for j in range(4)]  # as the server fans out n=4: seeds s, s+1, ...
    outs = llm.generate([wl.prompts[0]] * 4, params)
    wall = time.perf_counter() - t0
    return {"output_tok_s": sum(len(o.outputs[0].token_ids) for o in outs) / wall,
            "computed": counters()[0] - p0, "preempt": 0, "ttft": float("nan")}


def closed(c: int) -> dict:
    p0, q0 = counters()
    r = run_workload(eng, wl, c, 2 * c)
    p1, q1 = counters()
    return {"output_tok_s": r["output_tok_s"], "computed": p1 - p0, "preempt": q1 - q0,
            "ttft": r["ttft_p50_ms"]}


points = [(f"rag c{c}", lambda c=c: closed(c)) for c in CONCS] + [("one prompt x4", n4)]
for rnd in range(ROUNDS):
    for name, fn in points:
        modes = ["wait", "nowait"]
        random.Random(rnd * 100 + len(name)).shuffle(modes)
        for mode in modes:
            scheduler.MIN_SHARED_TOKENS_TO_WAIT = WAIT if mode == "wait" else 1 << 30
            rows.setdefault((name, mode), []).append(fn())
        print(f"round {rnd} {name}: " + "  ".join(
            f"{m} {rows[(name, m)][-1]['output_tok_s']:.1f}" for m in ("nowait", "wait")),
            flush=True)
scheduler.MIN_SHARED_TOKENS_TO_WAIT = WAIT

print(f"\n| point | nowait tok/s | wait tok/s | wait / nowait (median of rounds) | prompt tokens "
      f"computed nowait -> wait | preemptions | TTFT p50 ms nowait -> wait |")
print("|---|---:|---:|---:|---|---|---|")
for name, _ in points:
    a, b = rows[(name, "nowait")], rows[(name, "wait")]
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    ratio = statistics.median(y["output_tok_s"] / x["output_tok_s"] for x, y in zip(a, b))
    print(f"| {name} | {med(a, 'output_tok_s'):.1f} | {med(b, 'output_tok_s'):.1f} | {ratio:.2f}x "
          f"| {med(a, 'computed'):.0f} -> {med(b, 'computed'):.0f} | {sum(r['preempt'] for r in a)} -> "
          f"{sum(r['preempt'] for r in b)} | {med(a, 'ttft'):.0f} -> {med(b, 'ttft'):.0f} |")
