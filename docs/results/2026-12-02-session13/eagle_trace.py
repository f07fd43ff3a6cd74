"""Trace adaptive's inputs and choice per step, EAGLE json c1 (after one warm run)."""
import os, sys
import numpy as np
from specserve.bench.lab import build_llm, prepare_workload, proposer_config, run_workload, warm_up
from specserve.spec_decode import policy as pol
HEAD = os.path.expanduser("~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-eagle")
wl = sys.argv[1]
llm = build_llm(None, {"speculative_config": proposer_config("eagle", 4, eagle_model=HEAD),
                      "speculation_policy": "adaptive", "enable_prefix_caching": True, "kv_cache_memory": 2 << 30})
e = llm.engine; warm_up(e)
w = prepare_workload(e, wl, cap=32)
run_workload(e, w, 1, 8, False, warm_shared_prefix=True)
p = e.spec_policy
tc, dc = p.target_cost, p.draft_cost
print("target T(1..6) ms", [round(float(tc(n)) * 1e3, 2) for n in range(1, 7)], "scale", round(tc.scale, 3))
print("draft fwd(1) ms", round(float(dc(1)) * 1e3, 2), "scale", round(dc.scale, 3),
      "catch-up extra 150 tok ms", round(float(dc.extra_tokens_time(np.array([1.0]), np.array([150.0]))[0]) * 1e3, 2))
orig = pol.AdaptivePolicy.choose
log = []
def choose(self, reqs, num_running, num_base_tokens, catch_up, num_prefill_tokens=0, caps=None):
    ks = orig(self, reqs, num_running, num_base_tokens, catch_up, num_prefill_tokens, caps)
    r = reqs[0]
    log.append((r.request_id[-4:], r.num_output_tokens, r.max_tokens, list(catch_up), caps if caps is None else list(caps),
                np.round(self.acceptance.estimates([r.request_id])[0], 2).tolist(), ks, num_base_tokens, num_prefill_tokens))
    return ks
pol.AdaptivePolicy.choose = choose
out = run_workload(e, w, 1, 4, False, warm_shared_prefix=True)
for row in log: print(*row)
print("tok/s", out["output_tok_s"])
