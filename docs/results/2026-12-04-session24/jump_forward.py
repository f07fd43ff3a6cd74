"""Jump-forward drafts: the json workload held to the JSON schema each prompt spells out,
greedy, four engines in one process, run side by side in shuffled order round by round:

- off:            no proposer, jump_forward_tokens=0 (plain constrained decoding)
- jump-forward:   no proposer, the grammar's forced tokens verified as drafts (the default)
- ngram:          n-gram proposer (K=4) under the adaptive policy, jump_forward_tokens=0
- ngram+jf:       the same with jump-forward drafts

Requests run in waves of `concurrency`. Replies are compared with off's (token ids).

    python docs/results/2026-12-04-session24/jump_forward.py [ROUNDS] [CONCURRENCY,...] [compact|any]
"""

import random
import statistics
import sys
import time

from specserve import LLM, SamplingParams, StructuredOutputsParams
from specserve.bench.workloads import json_schema, load_workload

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
concurrencies = [int(c) for c in (sys.argv[2] if len(sys.argv) > 2 else "1,8,32").split(",")]
spacing = sys.argv[3] if len(sys.argv) > 3 else "compact"
ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
engines = {
    "off": LLM(jump_forward_tokens=0),
    "jump-forward": LLM(),
    "ngram": LLM(speculative_config=ngram, jump_forward_tokens=0),
    "ngram+jf": LLM(speculative_config=ngram),
}
items = load_workload("json")
conversations = [item.messages for item in items]
params = [SamplingParams(temperature=0, max_tokens=item.max_tokens,
                         structured_outputs=StructuredOutputsParams(
                             json=json_schema(item), disable_any_whitespace=spacing == "compact"))
          for item in items]
for llm in engines.values():  # compile every schema once, outside the timed runs
    for p in params:
        llm.engine.compile_grammar(p)
rng = random.Random(0)
KEYS = ("num_steps", "num_draft_tokens", "num_accepted_tokens", "num_jump_forward_tokens",
        "num_jump_forward_accepted")

print(f"json workload under its schema ({spacing} whitespace), greedy, {rounds} rounds")
for c in concurrencies:
    n = max(c * 2, 8)
    batch = [(conversations[i % len(items)], params[i % len(items)]) for i in range(n)]
    tps = {name: [] for name in engines}
    counts = {name: dict.fromkeys(KEYS, 0) for name in engines}
    replies: dict[str, list] = {}
    for _ in range(rounds):
        order = list(engines)
        rng.shuffle(order)
        for name in order:
            llm = engines[name]
            s0 = llm.get_stats()
            t = time.perf_counter()
            outs = []
            for i in range(0, n, c):  # waves of c requests
                wave = batch[i:i + c]
                outs += llm.chat([m for m, _ in wave], [p for _, p in wave])
            wall = time.perf_counter() - t
            s1 = llm.get_stats()
            ids = [o.outputs[0].token_ids for o in outs]
            replies.setdefault(name, ids)
            tps[name].append(sum(map(len, ids)) / wall)
            for k in KEYS:
                counts[name][k] += s1[k] - s0[k]
    base = statistics.median(tps["off"])
    for name in engines:
        m = statistics.median(tps[name])
        k = counts[name]
        jf = (f"jf {k['num_jump_forward_accepted']}/{k['num_jump_forward_tokens']}"
              if k["num_jump_forward_tokens"] else "jf -")
        ng = (f"ngram {k['num_accepted_tokens']}/{k['num_draft_tokens']}"
              if k["num_draft_tokens"] else "ngram -")
        same = sum(a == b for a, b in zip(replies[name], replies["off"], strict=True))
        print(f"c{c:<3} {name:13s} {m:7.1f} tok/s  {m / base:5.2f}x off  "
              f"[{min(tps[name]) / base:.2f}-{max(tps[name]) / base:.2f}]  "
              f"steps {k['num_steps'] // rounds:5d}  {jf:14s} {ng:14s} "
              f"replies as off's {same}/{n}", flush=True)
