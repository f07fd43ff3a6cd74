"""A fresh adaptive-EAGLE engine, as the lab builds it: its start-up profile at 1-8 tokens (before
any online refinement) and the drafts it makes on json at concurrency 1 (8 prompts, 64-token
replies). Session 32's lab had one engine in three that priced a second token at +3 ms and never
drafted. Usage: EAGLE=DIR python eagle_lock.py"""
import os

from specserve.bench.lab import (builtin_strategies, build_llm, prepare_workload, run_workload,
                                 warm_up)

s = builtin_strategies(eagle_model=os.path.expanduser(os.environ["EAGLE"]))["adaptive-eagle"]
llm = build_llm(None, {"max_num_seqs": 128, **s.engine_kwargs})
t, d = llm.engine._cost_models
start = {n: round(float(t(n)) * 1e3, 2) for n in (1, 2, 3, 4, 8)}  # scale 1 until a step runs
warm_up(llm.engine)
wl = prepare_workload(llm.engine, "json", cap=64)
out = run_workload(llm.engine, wl, 1, 8, False, False)
print(f"profile {llm.engine.profile_time:.1f} s; start-up target ms {start}; "
      f"T(2) - T(1) {start[2] - start[1]:.2f} ms; json c1 tok/s {out['output_tok_s']:.1f} "
      f"drafts {out['num_draft_tokens']} K mean {out['spec_k_mean']:.2f}", flush=True)
