"""rag at concurrency 1, adaptive n-gram: the per-position acceptance estimates and the K chosen, step
by step (every third step printed). Run: .venv/bin/python docs/results/2026-12-01-session10/rag_trace.py"""
import numpy as np
from specserve import LLM, SamplingParams
from specserve.bench.workloads import load_workload
from specserve.spec_decode import policy as pol_mod
llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4}, speculation_policy="adaptive")
items = load_workload("rag")[:4]
orig = pol_mod.AdaptivePolicy.choose if hasattr(pol_mod, "AdaptivePolicy") else None
cls = [c for c in vars(pol_mod).values() if isinstance(c, type) and "choose" in vars(c) and hasattr(c, "__init__") and "target_cost" in c.__init__.__code__.co_varnames][0]
orig = cls.choose
log = []
def traced(self, reqs, num_running, num_base_tokens, catch_up, num_prefill_tokens=0, caps=None):
    ks = orig(self, reqs, num_running, num_base_tokens, catch_up, num_prefill_tokens, caps)
    a = self.acceptance.estimates([r.request_id for r in reqs])[0]
    log.append((caps, ks, np.round(a, 2).tolist(), round(self.last_predicted_s * 1e3, 2), round(self.target_cost.scale, 3), reqs[0].num_tokens))
    return ks
cls.choose = traced
tok = llm.get_tokenizer()
for it in items:
    out = llm.chat(it.messages, SamplingParams(temperature=0, max_tokens=min(it.max_tokens, 32)))
for row in log[::3][:60]:
    print(row)
print(llm.get_stats().get("spec", llm.get_stats()))
