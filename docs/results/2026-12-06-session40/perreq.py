"""Between-request spread of first-draft acceptance (static K=1): how much a request's own record says."""
import os, sys, collections, statistics
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload
from specserve.bench.trained import unseen_items
import specserve.spec_decode.policy as pol
head = os.path.expanduser("~/.cache/specserve/drafts/s39-eagle")
method = sys.argv[1]
cfg = {"method": method, "num_speculative_tokens": 1} | ({"model": head} if method == "eagle" else {})
llm = LLM(speculative_config=cfg, speculation_policy="static", kv_cache_memory=1 << 30)
eng = llm.engine
obs = collections.defaultdict(list)
o2 = pol.SpecPolicy.observe_verification
def ov(self, req, nd, na):
    obs[req.request_id].append(na >= 1); return o2(self, req, nd, na)
pol.SpecPolicy.observe_verification = ov
for w in sys.argv[2].split(","):
    items = unseen_items(w, [head])
    wl = prepare_workload(eng, w, items, cap=64, scale=1.0)
    obs.clear()
    run_workload(eng, wl, 1, len(items))
    rates = [sum(v) / len(v) for v in obs.values() if len(v) >= 8]
    ns = [len(v) for v in obs.values() if len(v) >= 8]
    p = sum(sum(v) for v in obs.values()) / sum(len(v) for v in obs.values())
    var_obs = statistics.pvariance(rates)
    noise = statistics.mean(p * (1 - p) / n for n in ns)
    tau2 = max(var_obs - noise, 0)
    print(f"{method} {w}: requests {len(rates)} pooled {p:.2f} per-request {sorted(round(r,2) for r in rates)} var {var_obs:.4f} binomial noise {noise:.4f} tau^2 {tau2:.4f} -> prior weight ~{(p*(1-p)/tau2 - 1) if tau2 else float('inf'):.1f}", flush=True)
