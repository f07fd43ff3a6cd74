"""Where adaptive's speculation bookkeeping goes when it drafts little: prose, n-gram, at
concurrency C (env, default 4), off and adaptive alternated on one engine, ROUNDS rounds of
32 prompts. Prints tok/s, and the engine's spec_time per step (observe_step + plan + look-ups)."""
import os
from specserve import LLM
from specserve.bench.lab import prepare_workload, proposer_config, run_workload, warm_up

C = int(os.environ.get("C", 4))
ROUNDS = int(os.environ.get("ROUNDS", 4))
llm = LLM(speculative_config=proposer_config("ngram", 4), speculation_policy="adaptive")
e = llm.engine
warm_up(e)
w = prepare_workload(e, "prose", cap=32)
for r in range(ROUNDS):
    for pol in ("off", "adaptive") if r % 2 == 0 else ("adaptive", "off"):
        e.set_speculation_policy(pol)
        s0, n0 = e.stats.spec_time, e.stats.num_steps
        run = run_workload(e, w, C, 32)
        steps = e.stats.num_steps - n0
        print(f"{pol:8s} c{C} {run['output_tok_s']:7.1f} tok/s  spec {1e3 * (e.stats.spec_time - s0) / steps:.3f} ms/step"
              f"  step {1e3 * run['step_time_s'] / steps:.2f} ms  K mean {run['spec_k_mean']}", flush=True)
