"""The start-up profile, old against new, side by side on one engine (#4).

`adaptive` plans on this tree's profile (every count 1-16 in interleaved rounds, monotone fit);
`adaptive-old` on the profile of b94e777 (fastest of 3 per point at 1,2,3,4,6,8,12,16,...,
flat-then-linear fit), measured on the same engine right after, with the same context terms.
Both policies, `off` and `static:2` run as `bench sweep` runs them: closed loops, interleaved
rounds with the order rotated, the median run per cell, per-round ratios.
Usage (from the repo root):
  python docs/results/2026-12-03-session19/ab_profile.py PROPOSER WORKLOADS CONCURRENCIES ROUNDS OUT.json
  e.g. ngram prose,json,rag 1,2,4,8 3 out.json;  draft:DIR json 1,2,4 4 out.json"""
import json, statistics, sys
from specserve.bench.lab import build_llm, prepare_workload, proposer_config, run_workload, warm_up
from specserve.bench.sweep import median_run
from specserve.spec_decode.cost_model import DraftCostModel, StepCostModel
from specserve.spec_decode.policy import AdaptivePolicy, build_policy

sys.path.insert(0, "docs/results/2026-12-03-session19")
from ab_profile_old import old_profiler  # noqa: E402

proposer, workloads, concs, rounds, out = sys.argv[1], sys.argv[2].split(","), \
    [int(c) for c in sys.argv[3].split(",")], int(sys.argv[4]), sys.argv[5]


def convert(m, draft=False):
    step = StepCostModel(m.x.tolist(), m.y.tolist(), m.ema, m.kv_read_s, m.attention_s, m.base_context)
    if not draft:
        return step
    return DraftCostModel(step, StepCostModel(m.catch_up.x.tolist(), m.catch_up.y.tolist()))


kind, _, draft_dir = proposer.partition(":")
cfg = proposer_config(kind, 4, draft_model=draft_dir or None)
llm = build_llm(None, {"speculative_config": cfg, "speculation_policy": "adaptive",
                       "max_num_seqs": 128, "enable_prefix_caching": True})
e = llm.engine
warm_up(e)
new_t, new_d = e._cost_models
old = old_profiler()
old_t = convert(old.profile_forward(e.runner))
old_t.kv_read_s, old_t.attention_s = new_t.kv_read_s, new_t.attention_s  # same context terms
old_d = None
if new_d is not None:
    old_d = convert(old.profile_draft(e.proposer.runner), draft=True)
e.block_manager.reset_prefix_cache()
show = lambda m: {n: round(1e3 * m(n), 2) for n in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16)}
print("new T(n) ms", show(new_t)); print("old T(n) ms", show(old_t))
if new_d is not None:
    print("new draft ms", show(new_d)); print("old draft ms", show(old_d))
policies = ["off", "static:2", "adaptive", "adaptive-old"]
cells = []
for w in workloads:
    wl = prepare_workload(e, w, cap=32)
    installed = {"off": build_policy("off", 4), "static:2": build_policy("static", 2),
                 "adaptive": AdaptivePolicy(4, new_t, new_d),
                 "adaptive-old": AdaptivePolicy(4, old_t, old_d)}
    for c in concs:
        runs = {p: [] for p in policies}
        for r in range(rounds):
            for p in policies[r % 4:] + policies[:r % 4]:
                e.spec_policy, e._idle_plan, e._shadow = installed[p], None, {}
                runs[p].append(run_workload(e, wl, c, max(c, 8), False, warm_shared_prefix=True))
        row = {p: median_run(runs[p]) for p in policies}
        ratio = lambda a, b: statistics.median(x["output_tok_s"] / y["output_tok_s"]
                                               for x, y in zip(runs[a], runs[b]))
        line = {"workload": w, "concurrency": c,
                **{p: round(row[p]["output_tok_s"], 1) for p in policies},
                "new/old": round(ratio("adaptive", "adaptive-old"), 3),
                "new/off": round(ratio("adaptive", "off"), 3),
                "old/off": round(ratio("adaptive-old", "off"), 3),
                "new/static2": round(ratio("adaptive", "static:2"), 3),
                "old/static2": round(ratio("adaptive-old", "static:2"), 3),
                "K new": row["adaptive"]["spec_k_histogram"],
                "K old": row["adaptive-old"]["spec_k_histogram"]}
        print(json.dumps(line), flush=True)
        cells.append({**line, "runs": {p: [{k: v for k, v in x.items() if k != "requests"}
                                           for x in runs[p]] for p in policies}})
json.dump({"cells": cells, "new_profile": show(new_t), "old_profile": show(old_t)},
          open(out, "w"), indent=1)
