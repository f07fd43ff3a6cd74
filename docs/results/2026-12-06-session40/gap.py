"""Is an EAGLE guess made after steps without drafting (the head catches up) as good as one made every step?"""
import os, sys
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload
from specserve.bench.trained import unseen_items
from specserve.spec_decode.policy import SpecPolicy
import specserve.engine.spec_planner as sp; sp.REPLAN_STEPS = 0
head = os.path.expanduser("~/.cache/specserve/drafts/s39-eagle")
llm = LLM(speculative_config={"method": "eagle", "model": head, "num_speculative_tokens": 4},
          speculation_policy="static", kv_cache_memory=1 << 30)
eng = llm.engine
W = sys.argv[1] if len(sys.argv) > 1 else "prose"
wl = prepare_workload(eng, W, unseen_items(W, [head]), cap=64, scale=1.0)
class Every(SpecPolicy):
    def __init__(self, every):
        super().__init__(4); self.every = every; self.n = 0; self.name = f"every{every}"
    def choose(self, reqs, *a, **k):
        self.n += 1
        return [1 if self.n % self.every == 0 else 0 for _ in reqs]
for every in (1, 2, 4, 8, 16):
    eng.set_speculation_policy("static", 1)
    eng.spec_policy = Every(every) if every > 1 else eng.spec_policy
    x = run_workload(eng, wl, 1, 30)
    print(f"draft every {every} steps: drafts {x['num_draft_tokens']} accepted {x['num_accepted_tokens']} rate {x['num_accepted_tokens']/max(x['num_draft_tokens'],1):.3f}", flush=True)
