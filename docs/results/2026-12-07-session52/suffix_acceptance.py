"""Suffix decoding's guesses, counted: static K=4 (every step drafts what the proposer finds),
greedy, the lab's closed loop (bench/lab.py run_workload: no request guessed from its own
prompt's replies, the cache empty at the start). Deterministic up to batch-shape rounding, so
two checkouts can be compared run against run.

    HF_HUB_OFFLINE=1 .venv/bin/python docs/results/2026-12-07-session52/suffix_acceptance.py
"""

from __future__ import annotations

import os
import sys

from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload
from specserve.bench.workloads import load_workload

WORKLOADS = os.environ.get("WORKLOADS", "prose,json,sql,chat-1").split(",")
PROMPTS, CONCURRENCY, CAP = int(os.environ.get("PROMPTS", 48)), 4, 64

llm = LLM(speculation_policy="static", enable_prefix_caching=False,
          speculative_config={"method": "suffix", "num_speculative_tokens": 4})
engine = llm.engine
print(f"{'workload':10} {'tokens':>7} {'steps':>6} {'drafted':>8} {'accepted':>8} "
      f"{'acc/draft':>9} {'tok/step':>8}", file=sys.stderr)
for name in WORKLOADS:
    items = load_workload(name)
    work = prepare_workload(engine, name, items, cap=CAP)
    run = run_workload(engine, work, CONCURRENCY, min(PROMPTS, len(items)))
    steps, gen = run["num_steps"], run["num_generated_tokens"]
    drafted, accepted = run["num_draft_tokens"], run["num_accepted_tokens"]
    print(f"{name:10} {gen:7d} {steps:6d} {drafted:8d} {accepted:8d} "
          f"{accepted / max(drafted, 1):9.3f} {gen / steps:8.2f}")
