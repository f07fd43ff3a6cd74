"""The trained EAGLE head's cost per proposed token against one target forward, in the engine.

Concurrency 1, prose, greedy, static K = 3 (the head runs every step): the head's time per
forward (draft_time_s / draft_num_forwards) against the target's (forward_time_s / num_steps).
Run: python eagle_cost.py ~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-eagle
"""
import sys

from specserve import LLM, SamplingParams
from specserve.bench.workloads import load_workload

head = sys.argv[1]
items = load_workload("prose")[:6]
for k in (1, 3):
    llm = LLM(speculation_policy="static",
              speculative_config={"method": "eagle", "model": head, "num_speculative_tokens": k})
    msgs = [llm.engine.apply_chat_template(it.messages) for it in items]
    llm.generate(msgs[:1], SamplingParams(temperature=0, max_tokens=8))  # warm-up
    before = llm.get_stats()
    for m in msgs:  # one request at a time: concurrency 1
        llm.generate([m], SamplingParams(temperature=0, max_tokens=64))
    s = llm.get_stats()
    d = {key: s[key] - before[key] for key in ("draft_time_s", "draft_num_forwards",
                                               "forward_time_s", "num_steps",
                                               "num_draft_tokens", "num_accepted_tokens")}
    head_ms = 1e3 * d["draft_time_s"] / d["draft_num_forwards"]
    target_ms = 1e3 * d["forward_time_s"] / d["num_steps"]
    print(f"K={k}: head {head_ms:.2f} ms per forward, target {target_ms:.2f} ms per forward "
          f"(verify steps included): {head_ms / target_ms:.1%}; acceptance "
          f"{d['num_accepted_tokens'] / d['num_draft_tokens']:.1%} of {d['num_draft_tokens']}")
    del llm
