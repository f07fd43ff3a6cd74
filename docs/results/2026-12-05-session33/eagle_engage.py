"""Why does one adaptive-EAGLE engine draft on json at concurrency 1 and the next not? N fresh
engines run the lab's json prompts one at a time (greedy, 64-token cap) with the trained head;
every plan's inputs are recorded: the request's first-position estimate, the global rate, the
catch-up, and the K chosen. Prints per engine the drafts, the prices the profile gave, and the
first plans of each request. Usage: N=3 python eagle_engage.py EAGLE_DIR [WORKLOAD]"""
import os
import sys

import numpy as np

from specserve import LLM, SamplingParams
from specserve.bench.workloads import load_workload
from specserve.spec_decode import policy as policy_mod

head, workload = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "json")
log = []
orig = policy_mod.AdaptivePolicy.choose


def choose(self, reqs, num_running, num_base_tokens, catch_up, *args, **kwargs):
    ks = orig(self, reqs, num_running, num_base_tokens, catch_up, *args, **kwargs)
    ids = [r.request_id for r in reqs]
    log.append((ids[0], float(self.acceptance.estimates(ids)[0][0]),
                float(self.acceptance.global_rate), int(catch_up[0]), int(ks[0])))
    return ks


policy_mod.AdaptivePolicy.choose = choose
items = load_workload(workload)
for e in range(int(os.environ.get("N", "3"))):
    log.clear()
    llm = LLM(speculative_config={"method": "eagle", "model": head, "num_speculative_tokens": 4},
              speculation_policy="adaptive", enable_prefix_caching=False)
    eng = llm.engine
    t, d = eng.spec_policy.target_cost, eng.spec_policy.draft_cost
    print(f"engine {e}: target ms T(1..4) {[round(t(n) * 1e3, 2) for n in (1, 2, 3, 4)]} "
          f"draft ms T(1,2) {[round(d(n) * 1e3, 2) for n in (1, 2)]}")
    drafts = 0
    for it in items:
        sp = SamplingParams(max_tokens=min(it.max_tokens, 64), temperature=0.0)
        llm.generate([eng.apply_chat_template(it.messages)], sp)
    by_req: dict[str, list] = {}
    for rid, a, g, c, k in log:
        by_req.setdefault(rid, []).append((a, g, c, k))
    for rid, rows in by_req.items():
        ks = [k for *_, k in rows]
        drafts += sum(ks)
        print(f"  req {rid[-4:]}: plans {len(rows)} drafts {sum(ks)} | first 6 (est, global, "
              f"catch-up, K): " + " ".join(f"({a:.2f},{g:.2f},{c},{k})" for a, g, c, k in rows[:6]))
    print(f"  total drafts {drafts}; mean est {np.mean([r[1] for r in log]):.2f}", flush=True)
    del llm
