"""Exploration, not landed: LOOKUP_FIRST_SEQS (engine/spec_planner.py since session 37,
llm_engine.py before; up to that many requests, n-gram guesses are looked up and planned every
step; above it, plan first and let an all-zero plan stand for up to REPLAN_STEPS steps) at 8
(main) and at 4, next to `off` and static K = 2, on one engine as session 34's overhead_split.py
runs it: WORKLOAD at concurrency C, ROUNDS rounds of N prompts, the order rotated every round.
Each adaptive variant keeps its own policy object. Per run: tok/s and the speculation work per
step."""
import os
import statistics

import specserve.engine.spec_planner as spec_planner
from specserve import LLM
from specserve.bench.lab import prepare_workload, proposer_config, run_workload, warm_up
from specserve.bench.sweep import parse_policy

C = int(os.environ.get("C", 8))
ROUNDS = int(os.environ.get("ROUNDS", 6))
N = int(os.environ.get("N", 32))
WORKLOAD = os.environ.get("WORKLOAD", "prose")
SIDES = ["off", "static:2", "adaptive@8", "adaptive@4"]
llm = LLM(speculative_config=proposer_config("ngram", 4), speculation_policy="adaptive",
          enable_prefix_caching=True, max_num_seqs=128)
e = llm.engine
warm_up(e)
w = prepare_workload(e, WORKLOAD, cap=32)
installed: dict = {}
rows: dict[str, list[tuple]] = {s: [] for s in SIDES}
for r in range(ROUNDS):
    for side in SIDES[r % len(SIDES):] + SIDES[:r % len(SIDES)]:
        pol, _, boundary = side.partition("@")
        spec_planner.LOOKUP_FIRST_SEQS = int(boundary or 8)
        e.planner.reset()
        if side in installed:
            e.spec_policy = installed[side]
        else:
            e.set_speculation_policy(*parse_policy(pol, 4))
            installed[side] = e.spec_policy
        run = run_workload(e, w, C, N, warm_shared_prefix=True)
        n = run["num_steps"]
        row = (run["output_tok_s"], 1e3 * run["spec_time_s"] / n, run["num_draft_tokens"],
               run["num_accepted_tokens"])
        rows[side].append(row)
        print(f"{side:11s} {WORKLOAD} c{C} {row[0]:7.1f} tok/s  spec {row[1]:.3f} ms/step  steps "
              f"{n}  drafts {row[2]} accepted {row[3]}  K {run['spec_k_histogram']}", flush=True)
for side, rs in rows.items():
    print(f"median {side:11s} {statistics.median(x[0] for x in rs):7.1f} tok/s  spec "
          f"{statistics.median(x[1] for x in rs):.3f} ms/step  drafts "
          f"{statistics.median(x[2] for x in rs):.0f}")
for a, b in [("adaptive@4", "adaptive@8"), ("adaptive@8", "off"), ("adaptive@4", "off"),
             ("adaptive@8", "static:2"), ("adaptive@4", "static:2")]:
    ratios = [x[0] / y[0] for x, y in zip(rows[a], rows[b], strict=True)]
    print(f"{a}/{b} per round: {[round(x, 3) for x in ratios]}  median "
          f"{statistics.median(ratios):.3f}")
