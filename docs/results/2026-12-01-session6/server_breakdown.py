"""Where the server's throughput goes, step by step: online (a live `specserve serve` on :8013,
the bench's aiohttp client) and offline (the same engine flags in this process), alternating.
Prints per engine step: output tokens, forward time, whole-step time and wall time.

    specserve serve --port 8013 &
    python docs/results/2026-12-01-session6/server_breakdown.py 32 64
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request

from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload, warm_up
from specserve.bench.online import run_online_point
from specserve.bench.workloads import load_workload

URL = "http://127.0.0.1:8013"
KEYS = ["num_steps", "num_generated_tokens", "num_prompt_tokens", "forward_time_s",
        "step_time_s"]


def server_stats() -> dict:
    with urllib.request.urlopen(f"{URL}/stats") as resp:
        return json.load(resp)


def show(tag: str, before: dict, after: dict, result: dict) -> None:
    d = {k: after[k] - before[k] for k in KEYS}
    n = d["num_steps"]
    print(f"{tag:8s} tok/s {result['output_tok_s']:7.1f}  steps {n}  "
          f"tok/step {d['num_generated_tokens'] / n:.2f}  "
          f"forward {d['forward_time_s'] / n * 1e3:.2f}  step {d['step_time_s'] / n * 1e3:.2f}  "
          f"wall {result['wall_s'] / n * 1e3:.2f} ms/step  prompt tokens {d['num_prompt_tokens']}")


def main(concurrency: int, num_prompts: int, rounds: int = 3) -> None:
    items = load_workload("prose")
    llm = LLM()
    warm_up(llm.engine)
    workload = prepare_workload(llm.engine, "prose", items, cap=64)
    asyncio.run(run_online_point(URL, items, concurrency, 8, max_tokens_cap=4))  # warm-up
    for _ in range(rounds):
        before = server_stats()
        result = asyncio.run(run_online_point(URL, items, concurrency, num_prompts,
                                              max_tokens_cap=64, warm_up=False))
        show("online", before, server_stats(), result)
        before = llm.engine.get_stats()
        result = run_workload(llm.engine, workload, concurrency, num_prompts,
                              reset_prefix_cache=False)
        show("offline", before, llm.engine.get_stats(), result)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
