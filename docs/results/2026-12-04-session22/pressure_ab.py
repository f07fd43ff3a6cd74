"""Whole-prompt admission on and off, alternated in one engine under memory pressure: rag
closed loop (2.5k-token prompts, replies capped at 64 tokens) in a pool that holds fewer
prompts than the concurrency. Off = the old rule (admit when the first chunk fits).
python docs/results/2026-12-04-session22/pressure_ab.py ROUNDS C NPROMPTS KV_GIB CACHING(0|1)
Needs exp-whole-prompt-admission.patch applied (git apply); not landed."""
import random, statistics, sys
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload
from specserve.engine.block_manager import BlockManager

ROUNDS, C, N = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
KV, CACHING = float(sys.argv[4]), sys.argv[5] == "1"
whole = BlockManager.blocks_to_admit
llm = LLM(kv_cache_memory=int(KV * 2**30), enable_prefix_caching=CACHING)
eng = llm.engine
wl = prepare_workload(eng, "rag", cap=64)
print(f"rag c{C} x{N}, {KV} GiB ({eng.block_manager.num_blocks} blocks: "
      f"{eng.block_manager.num_blocks * 16 // 2560} prompts of 2.56k), prefix caching {CACHING}")
rows: dict = {"whole": [], "chunk": []}
for rnd in range(ROUNDS):
    modes = ["whole", "chunk"]
    random.Random(rnd).shuffle(modes)
    for mode in modes:
        BlockManager.blocks_to_admit = whole if mode == "whole" else (lambda self, r, c: 0)
        s0 = eng.get_stats()
        r = run_workload(eng, wl, C, N)
        s1 = eng.get_stats()
        rows[mode].append(dict(tok_s=r["output_tok_s"], wall=r["wall_s"],
                               computed=s1["num_prompt_tokens"] - s0["num_prompt_tokens"],
                               preempt=s1["num_preemptions"] - s0["num_preemptions"],
                               ttft=r["ttft_p50_ms"]))
        x = rows[mode][-1]
        print(f"round {rnd} {mode:5}: {x['tok_s']:6.1f} tok/s  wall {x['wall']:6.1f} s  prompt "
              f"tokens computed {x['computed']:6d}  preemptions {x['preempt']:3d}  TTFT p50 "
              f"{x['ttft']:.0f} ms", flush=True)
BlockManager.blocks_to_admit = whole
ratio = statistics.median(w["tok_s"] / c["tok_s"] for w, c in zip(rows["whole"], rows["chunk"]))
print(f"whole / chunk tok/s, median of rounds: {ratio:.2f}x")
