"""Acceptance of a first draft (static K=1) by the request's output position."""
import os, sys, collections
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload
from specserve.bench.trained import unseen_items
import specserve.spec_decode.policy as pol
head = os.path.expanduser("~/.cache/specserve/drafts/s39-eagle")
method = sys.argv[1]
cfg = {"method": method, "num_speculative_tokens": 1} | ({"model": head} if method == "eagle" else {})
llm = LLM(speculative_config=cfg, speculation_policy="static", kv_cache_memory=1 << 30)
eng = llm.engine
obs = []
o2 = pol.SpecPolicy.observe_verification
def ov(self, req, nd, na):
    obs.append((nd, na, req.num_output_tokens)); return o2(self, req, nd, na)
pol.SpecPolicy.observe_verification = ov
B = (0, 2, 4, 8, 16, 32, 64, 1000)
for w in sys.argv[2].split(","):
    items = unseen_items(w, [head]) if method == "eagle" else unseen_items(w, [head])
    wl = prepare_workload(eng, w, items, cap=64, scale=1.0)
    obs.clear()
    run_workload(eng, wl, 1, len(items))
    acc = collections.defaultdict(lambda: [0, 0])
    for nd, na, pos in obs:
        if nd >= 1:
            b = max(i for i in range(len(B)) if pos - na > B[i]) if pos - na > 0 else 0
            acc[b][0] += na >= 1; acc[b][1] += 1
    print(method, w, "first-draft acceptance by output position before the step:",
          "  ".join(f"{B[b]+1}-{B[b+1]}: {a/n:.2f} (n={n})" for b, (a, n) in sorted(acc.items())), flush=True)
