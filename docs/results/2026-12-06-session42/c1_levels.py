"""n-gram adaptive on prose at concurrency 1: the K the plan chose per match length (evidence) and
the outcomes filed under each (verifications and shadow checks)."""
import collections, os
from specserve.bench.lab import build_llm, proposer_config, warm_up, prepare_workload, run_workload
from specserve.bench.sweep import SweepSettings
import specserve.spec_decode.policy as pol
llm = build_llm(None, {"speculative_config": proposer_config("ngram", 4), "speculation_policy": "adaptive",
                       "enable_prefix_caching": True, "max_num_seqs": 128})
eng = llm.engine; warm_up(eng)
pts = SweepSettings().points
w = prepare_workload(eng, "prose", pts.items("prose"), cap=pts.max_tokens_cap, scale=pts.max_tokens_scale)
chosen = collections.Counter(); outcome = collections.defaultdict(lambda: [0, 0])
orig_choose = pol.AdaptivePolicy.choose
def choose(self, reqs, *a, **k):
    ks = orig_choose(self, reqs, *a, **k)
    ev = k.get("evidence") or (a[5] if len(a) > 5 else None)
    for r, kk in zip(reqs, ks):
        chosen[(r.spec_evidence if ev is not None else -1, kk)] += 1
    return ks
pol.AdaptivePolicy.choose = choose
orig_obs = pol.SpecPolicy.observe_verification
def obs(self, req, n, a):
    o = outcome[(req.spec_evidence, n)]; o[0] += a; o[1] += 1
    return orig_obs(self, req, n, a)
pol.SpecPolicy.observe_verification = obs
for r in range(3):
    res = run_workload(eng, w, 1, pts.num_prompts(1), pts.ignore_eos, warm_shared_prefix=True)
    print("run", r, round(res["output_tok_s"], 1), "drafted", res["num_draft_tokens"], "accepted", res["num_accepted_tokens"], res["spec_k_histogram"])
print("(evidence, K) chosen:", sorted(chosen.items()))
print("(evidence, drafts observed incl. shadow): [accepted, count]", sorted((k, v) for k, v in outcome.items()))
acc = eng.spec_policy.acceptance
print("level rates", acc.evidence_rates(), "global", [round(x, 3) for x in acc.global_rates], "prior weight", acc.prior_weight)
print("cost model ms", {n: round(1e3 * eng.spec_policy.target_cost(n), 2) for n in (1, 2, 3, 5)})
