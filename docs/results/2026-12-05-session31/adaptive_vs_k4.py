"""Adaptive against static K = 4 in one process (n-gram), and what each plan saw: the lower
estimates per position, the guesses found (caps) and the K chosen. Args: concurrency, workload."""
import collections, numpy as np, sys
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload, warm_up
from specserve.spec_decode import policy as pol
C = int(sys.argv[1]) if len(sys.argv) > 1 else 2
WL = sys.argv[2] if len(sys.argv) > 2 else "json"
llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4}, speculation_policy="adaptive", enable_prefix_caching=False)
eng = llm.engine
warm_up(eng)
wl = prepare_workload(eng, WL)
log = []
orig = pol.AdaptivePolicy.choose
def choose(self, reqs, num_running, num_base_tokens, catch_up, num_prefill_tokens=0, caps=None):
    ks = orig(self, reqs, num_running, num_base_tokens, catch_up, num_prefill_tokens, caps)
    ids = [r.request_id for r in reqs]
    est = self.acceptance.estimates(ids) if len(ids) == 1 else self.acceptance.lower_estimates(ids)
    log.append((len(reqs), list(caps) if caps is not None else None, list(ks), np.round(np.asarray(est), 2).tolist(), num_base_tokens))
    return ks
pol.AdaptivePolicy.choose = choose
for policy in ("adaptive", "static"):
    eng.set_speculation_policy(policy)
    log.clear()
    out = run_workload(eng, wl, C, 8 * C, False, False)
    print(policy, "tok/s", round(out["output_tok_s"], 1), "drafts", out["num_draft_tokens"], "acc", round(out["acceptance_rate"] or 0, 3), "K hist", out["spec_k_histogram"])
    if policy == "adaptive":
        g = eng.spec_policy.acceptance.global_rates
        print("global rates", np.round(g, 2))
        cnt = collections.Counter()
        for n, caps, ks, est, nb in log:
            for c, k in zip(caps or [], ks):
                cnt[(c, k)] += 1
        print("(cap, chosen K) counts", sorted(cnt.items()))
        for row in log[40:60]:
            print(row)
