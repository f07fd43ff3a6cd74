"""Greedy output of 4 rag prompts submitted together, static n-gram K=3 against no speculation.
python docs/results/2026-12-04-session22/bf16_spec_ties.py DTYPE [old]  (old: the in-flight wait off)"""
import sys
from specserve import LLM, SamplingParams
from specserve.bench.lab import prepare_workload
from specserve.engine import scheduler
dtype = sys.argv[1]
if len(sys.argv) > 2: scheduler.MIN_SHARED_TOKENS_TO_WAIT = 1 << 30
p = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
ref = None
for name, kw in [("off", {}), ("ngram", dict(speculative_config={"method": "ngram", "num_speculative_tokens": 3}, speculation_policy="static"))]:
    llm = LLM(kv_cache_memory=1 << 29, dtype=dtype, **kw)
    wl = prepare_workload(llm.engine, "rag")
    outs = [o.outputs[0].token_ids for o in llm.generate(wl.prompts[:4], p)]
    s = llm.get_stats()
    print(dtype, sys.argv[2:], name, "hits", s["prefix_cache_hits"], "drafted", s["num_draft_tokens"], "same as off:", [a == b for a, b in zip(outs, ref)] if ref else "-")
    if ref:
        for a, b in zip(outs, ref):
            if a != b: print("  first diff at", next(i for i in range(len(a)) if a[i] != b[i]))
    ref = ref or outs
    del llm
