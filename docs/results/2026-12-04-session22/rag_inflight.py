"""rag, vanilla engine, closed loop, cold prefix cache per run: output tok/s, prompt tokens
computed (recomputation included), preemptions, prefix-cache hit rate.
python docs/results/2026-12-04-session22/rag_inflight.py C[,C...] [NPROMPTS] [KV_GIB]
NOWAIT=1: never wait for in-flight prefixes (the engine before this session's change)."""
import os, sys, time
from specserve.engine import scheduler
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload

concs = [int(c) for c in sys.argv[1].split(",")]
nprompts = int(sys.argv[2]) if len(sys.argv) > 2 else 0
kv = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
if os.environ.get("NOWAIT"):
    scheduler.MIN_SHARED_TOKENS_TO_WAIT = 1 << 30
llm = LLM(kv_cache_memory=int(kv * 2**30))
eng = llm.engine
wl = prepare_workload(eng, "rag", cap=64)
print(f"kv {kv} GiB: {eng.block_manager.num_blocks} blocks of {eng.block_manager.block_size}; "
      f"shared prefix {len(wl.shared_prefix)} tokens; prompts {min(map(len, wl.prompts))}-"
      f"{max(map(len, wl.prompts))} tokens")
for c in concs:
    n = nprompts or 2 * c
    s0 = eng.get_stats(); t0 = time.perf_counter()
    r = run_workload(eng, wl, c, n)
    s1 = eng.get_stats(); wall = time.perf_counter() - t0
    q = s1["prefix_cache_queries"] - s0["prefix_cache_queries"]
    h = s1["prefix_cache_hits"] - s0["prefix_cache_hits"]
    print(f"c{c:<3} n{n:<3} {r['output_tok_s']:7.1f} tok/s  wall {wall:6.1f} s  prompt tokens "
          f"computed {s1['num_prompt_tokens'] - s0['num_prompt_tokens']:7d}  preemptions "
          f"{s1['num_preemptions'] - s0['num_preemptions']:3d}  prefix hits {h}/{q}  "
          f"steps {s1['num_steps'] - s0['num_steps']}  ttft p50 {r['ttft_p50_ms']:.0f} ms",
          flush=True)
