"""Speculation under a grammar: the json workload's prompts held to `json_object` (and free, for
comparison), n-gram proposer, policies off / static K=4 / adaptive switched in place on one
engine, shuffled round by round. Greedy: the replies that differ from `off`'s are counted (in bf16
a verification forward can break a near-tie differently from a decode forward).

    python docs/results/2026-12-04-session23/spec_under_grammar.py [ROUNDS] [CONCURRENCY,...]
"""

import random
import statistics
import sys
import time

from specserve import LLM, SamplingParams, StructuredOutputsParams
from specserve.bench.workloads import load_workload

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
concurrencies = [int(c) for c in (sys.argv[2] if len(sys.argv) > 2 else "1,8").split(",")]
llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                              "prompt_lookup_max": 3})
conversations = [item.messages for item in load_workload("json")]
POLICIES = ["off", "static", "adaptive"]
rng = random.Random(0)

for c in concurrencies:
    for constrained in (True, False):
        so = StructuredOutputsParams(json_object=True) if constrained else None
        params = SamplingParams(temperature=0, max_tokens=96, structured_outputs=so)
        batch = [conversations[i % len(conversations)] for i in range(max(c, 8))]
        tps = {p: [] for p in POLICIES}
        acc = {p: [] for p in POLICIES}
        reference = None
        differ = {p: 0 for p in POLICIES}
        for _ in range(rounds):
            order = POLICIES[:]
            rng.shuffle(order)
            for policy in order:
                llm.engine.set_speculation_policy(policy)
                s0 = llm.get_stats()
                t = time.perf_counter()
                outs = []
                for i in range(0, len(batch), c):  # waves of c requests
                    outs += llm.chat(batch[i:i + c], params)
                wall = time.perf_counter() - t
                s1 = llm.get_stats()
                ids = [o.outputs[0].token_ids for o in outs]
                if policy == "off" and reference is None:
                    reference = ids
                elif reference is not None:
                    differ[policy] = max(differ[policy],
                                         sum(a != b for a, b in zip(ids, reference, strict=True)))
                tps[policy].append(sum(map(len, ids)) / wall)
                drafted = s1["num_draft_tokens"] - s0["num_draft_tokens"]
                accepted = s1["num_accepted_tokens"] - s0["num_accepted_tokens"]
                acc[policy].append(accepted / drafted if drafted else float("nan"))
        base = statistics.median(tps["off"])
        for p in POLICIES:
            median = statistics.median(tps[p])
            print(f"c{c:<3} {'json_object' if constrained else 'free':12s} {p:9s} "
                  f"{median:7.1f} tok/s  {median / base:5.2f}x off  "
                  f"acceptance {statistics.median(acc[p]):.2f}  "
                  f"replies unlike off's {differ[p]}/{len(batch)}")
