"""An EAGLE proposal's time by its depth K (static K = 1..4, prose, concurrency 1): is there a
fixed cost per proposal beside the per-forward one?"""
import collections, os
import numpy as np
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload
head = os.path.expanduser("~/.cache/specserve/drafts/s39-eagle")
llm = LLM(speculative_config={"method": "eagle", "model": head, "num_speculative_tokens": 4},
          speculation_policy="static", kv_cache_memory=1 << 30)
eng = llm.engine
import sys
wl = prepare_workload(eng, "prose", cap=int(sys.argv[1]) if len(sys.argv) > 1 else 32, scale=1.0)
run_workload(eng, wl, 1, 4)
for k in ("off", 1, 2, 4, "adaptive", "off", 1, "adaptive"):
    eng.set_speculation_policy(k, 4) if isinstance(k, str) else eng.set_speculation_policy("static", k)
    times = collections.defaultdict(list)
    orig = eng.planner.propose
    def propose(policy, orig=orig, times=times):
        d0 = eng.stats.draft_time
        orig(policy)
        if eng.stats.draft_time > d0:
            times[len(eng.proposer.last_forwards)].append(eng.stats.draft_time - d0)
    eng.planner.propose = propose
    x = run_workload(eng, wl, 1, 8)
    eng.planner.propose = orig
    print(f"K={k} tok/s {x['output_tok_s']:.1f} fwd/step {1e3*x['forward_time_s']/x['num_steps']:.2f} ms K mean {x['spec_k_mean']:.2f} acc {x['acceptance_rate'] or 0:.2f} | proposal time by forwards: " +
          ", ".join(f"{f}: {1e3*np.median(v):.2f} ms (n={len(v)})" for f, v in sorted(times.items())), flush=True)
