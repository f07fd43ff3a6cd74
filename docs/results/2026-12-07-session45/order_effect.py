"""Does a run's place in the sweep's rotation move its forward time? One engine with the sweep's
self-draft proposer; `off` and adaptive (which drafts nothing here) run the same steps, so any
difference in their target-forward time per step is the machine, not the work. The policies
rotate as bench sweep rotates them, and each run is filed under the policy that ran before it.
WL=prose CONC=1 ROUNDS=6 POLICIES=off,adaptive,batch-threshold:8 (the sweep's own neighbours)."""
import collections
import os
import statistics

from specserve.bench.lab import build_llm, prepare_workload, proposer_config, run_workload, warm_up
from specserve.bench.sweep import SweepSettings, parse_policy

WL = os.environ.get("WL", "prose")
CONC = int(os.environ.get("CONC", "1"))
ROUNDS = int(os.environ.get("ROUNDS", "6"))
POLICIES = os.environ.get("POLICIES", "off,adaptive,batch-threshold:8").split(",")
llm = build_llm(None, {"speculative_config": proposer_config("draft", 4),
                       "speculation_policy": "adaptive", "enable_prefix_caching": True,
                       "max_num_seqs": 128})
eng = llm.engine
warm_up(eng)
pts = SweepSettings().points
w = prepare_workload(eng, WL, pts.items(WL), cap=pts.max_tokens_cap, scale=pts.max_tokens_scale)
installed, prev = {}, None
rows = collections.defaultdict(list)  # (policy, previous policy) -> [(fwd ms/step, tok/s)]
for r in range(ROUNDS):
    for p in POLICIES[r % len(POLICIES):] + POLICIES[:r % len(POLICIES)]:
        if p in installed:
            eng.spec_policy = installed[p]
        else:
            eng.set_speculation_policy(*parse_policy(p, 4))
            installed[p] = eng.spec_policy
        out = run_workload(eng, w, CONC, pts.num_prompts(CONC), pts.ignore_eos,
                           warm_shared_prefix=True)
        rows[(p, prev)].append((1e3 * out["forward_time_s"] / out["num_steps"],
                                out["output_tok_s"], out["num_draft_tokens"]))
        prev = p
print(f"{WL} c{CONC}, {ROUNDS} rounds; target forward ms per step (median), tok/s (median)")
for (p, before), xs in sorted(rows.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
    print(f"{p:18s} after {str(before):18s} n={len(xs)}  fwd/step "
          f"{statistics.median(x[0] for x in xs):6.2f} ms  tok/s "
          f"{statistics.median(x[1] for x in xs):6.1f}  drafted {sum(x[2] for x in xs)}")
