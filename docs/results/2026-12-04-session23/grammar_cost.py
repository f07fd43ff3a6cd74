"""What a grammar and the penalties cost a step: the same batch of json-workload prompts, bf16,
greedy, free, held to any JSON object (`json_object`), and with repetition / frequency /
presence penalties, alternated round by round in one engine. Reports the step time and the
time spent filling and applying the token masks (GrammarBackend.mask), advancing the matchers
(accept_emitted) and applying the penalties (apply_penalties).

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
spent = {"mask": 0.0, "accept": 0.0, "penalties": 0.0}


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
llm_engine.apply_penalties = timed("penalties", llm_engine.apply_penalties)
KINDS = {"free": {}, "json_object": {"structured_outputs": StructuredOutputsParams(
    json_object=True)}, "penalties": {"repetition_penalty": 1.1, "frequency_penalty": 0.2,
                                      "presence_penalty": 0.2}}

for c in concurrencies:
    rows = {kind: [] for kind in KINDS}
    for _ in range(rounds):
        for kind in rows:
            params = SamplingParams(temperature=0, max_tokens=64, **KINDS[kind])
            batch = [conversations[i % len(conversations)] for i in range(c)]
            spent.update(mask=0.0, accept=0.0, penalties=0.0)
            s0 = llm.get_stats()
            t = time.perf_counter()
            outs = llm.chat(batch, params)
            wall = time.perf_counter() - t
            s1 = llm.get_stats()
            steps = s1["num_steps"] - s0["num_steps"]
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            rows[kind].append((wall / steps * 1e3, spent["mask"] / steps * 1e3,
                               spent["accept"] / steps * 1e3,
                               spent["penalties"] / steps * 1e3, tokens / wall))
    for kind, r in rows.items():
        med = [statistics.median(x[i] for x in r) for i in range(5)]
        print(f"c{c:<3} {kind:12s} step {med[0]:6.2f} ms  mask {med[1]:5.3f} ms  "
              f"accept {med[2]:5.3f} ms  penalties {med[3]:5.3f} ms  {med[4]:6.1f} tok/s")
