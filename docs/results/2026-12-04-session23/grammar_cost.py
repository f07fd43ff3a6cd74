"""What a grammar costs a step: the same batch of json-workload prompts, bf16, greedy, once
free and once held to any JSON object (`json_object`), alternated round by round in one engine.
Reports the step time and, for the constrained run, the time spent filling and applying the
token masks (GrammarBackend.mask) and advancing the matchers (accept_emitted).

    python docs/results/2026-12-04-session23/grammar_cost.py [ROUNDS] [CONCURRENCY,...]
"""

import statistics
import sys
import time

from specserve import LLM, SamplingParams, StructuredOutputsParams
from specserve.bench.workloads import load_workload
from specserve.engine import llm_engine
from specserve.sample import grammar

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
concurrencies = [int(c) for c in (sys.argv[2] if len(sys.argv) > 2 else "1,8,32").split(",")]
llm = LLM()
conversations = [item.messages for item in load_workload("json")]
spent = {"mask": 0.0, "accept": 0.0}


def timed(name, fn):
    def wrapper(*args, **kw):
        t = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            spent[name] += time.perf_counter() - t
    return wrapper


grammar.GrammarBackend.mask = timed("mask", grammar.GrammarBackend.mask)
llm_engine.accept_emitted = timed("accept", llm_engine.accept_emitted)

for c in concurrencies:
    rows = {"free": [], "json_object": []}
    for _ in range(rounds):
        for kind in rows:
            so = StructuredOutputsParams(json_object=True) if kind == "json_object" else None
            params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=False,
                                    structured_outputs=so)
            batch = [conversations[i % len(conversations)] for i in range(c)]
            spent.update(mask=0.0, accept=0.0)
            s0 = llm.get_stats()
            t = time.perf_counter()
            outs = llm.chat(batch, params)
            wall = time.perf_counter() - t
            s1 = llm.get_stats()
            steps = s1["num_steps"] - s0["num_steps"]
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            rows[kind].append((wall / steps * 1e3, spent["mask"] / steps * 1e3,
                               spent["accept"] / steps * 1e3, tokens / wall))
    for kind, r in rows.items():
        med = [statistics.median(x[i] for x in r) for i in range(4)]
        print(f"c{c:<3} {kind:12s} step {med[0]:6.2f} ms  mask {med[1]:5.3f} ms  "
              f"accept {med[2]:5.3f} ms  {med[3]:6.1f} tok/s")
