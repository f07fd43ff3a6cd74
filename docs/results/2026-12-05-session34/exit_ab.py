"""The plan's early exit on and off in one engine: WORKLOAD (env, default prose) at concurrency
C (default 4), adaptive policy, n-gram proposer, ROUNDS rounds of N prompts alternating the
two. Prints the speculation work per step, how many plans the exit answered, and tok/s."""
import os
import statistics

from specserve import LLM
from specserve.bench.lab import prepare_workload, proposer_config, run_workload, warm_up
from specserve.spec_decode import cost_model

C = int(os.environ.get("C", 4))
ROUNDS = int(os.environ.get("ROUNDS", 6))
N = int(os.environ.get("N", 32))
WORKLOAD = os.environ.get("WORKLOAD", "prose")
llm = LLM(speculative_config=proposer_config("ngram", 4), speculation_policy="adaptive",
          enable_prefix_caching=True, max_num_seqs=128)
e = llm.engine
warm_up(e)
w = prepare_workload(e, WORKLOAD, cap=32)
real = cost_model._no_plan_can_pay
tally = {"calls": 0, "fired": 0}


def counted(*args):
    fired = real(*args)
    tally["calls"] += 1
    tally["fired"] += fired
    return fired


spec: dict[str, list[float]] = {"exit": [], "no exit": []}
tput: dict[str, list[float]] = {"exit": [], "no exit": []}
for r in range(ROUNDS):
    for side in ("exit", "no exit") if r % 2 == 0 else ("no exit", "exit"):
        cost_model._no_plan_can_pay = counted if side == "exit" else (lambda *args: False)
        tally.update(calls=0, fired=0)
        s0, n0 = e.stats.spec_time, e.stats.num_steps
        run = run_workload(e, w, C, N, warm_shared_prefix=True)
        n = e.stats.num_steps - n0
        spec[side].append(1e3 * (e.stats.spec_time - s0) / n)
        tput[side].append(run["output_tok_s"])
        print(f"{side:8s} {WORKLOAD} c{C} {run['output_tok_s']:7.1f} tok/s  spec "
              f"{spec[side][-1]:.3f} ms/step  steps {n}  drafts {run['num_draft_tokens']}  "
              f"exit fired {tally['fired']} of {tally['calls']} multi-request plans", flush=True)
for side in spec:
    print(f"median {side:8s} spec {statistics.median(spec[side]):.3f} ms/step  "
          f"{statistics.median(tput[side]):.1f} tok/s")
