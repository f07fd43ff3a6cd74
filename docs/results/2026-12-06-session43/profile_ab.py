"""A/B in one engine: the adaptive n-gram controller priced by a start-up profile whose small
points are taken point by point (the fastest of a few runs each, as before 2026-12-06) against
one whose small points are taken in passes (_small_points), beside off and static:1 / static:2.
Closed loops as bench sweep runs them (3 waves, 32-token replies, rag's document warmed). Each
variant keeps its own policy (acceptance record, online scale) across rounds; the order rotates.
POINTS=prose:1,json:4 ROUNDS=N."""
import copy, os, statistics
import torch
from specserve.bench.lab import build_llm, proposer_config, warm_up, prepare_workload, run_workload
from specserve.bench.sweep import SweepSettings, parse_policy
from specserve.spec_decode import profiler

POINTS = [(p.split(":")[0], int(p.split(":")[1])) for p in
          os.environ.get("POINTS", "prose:1,json:1,prose:4,json:4").split(",")]
ROUNDS = int(os.environ.get("ROUNDS", "6"))
llm = build_llm(None, {"speculative_config": proposer_config("ngram", 4),
                       "speculation_policy": "adaptive", "enable_prefix_caching": True,
                       "max_num_seqs": 128})
eng = llm.engine
warm_up(eng)
new_cost = profiler.profile_forward(eng.runner)
passes = profiler._small_points
profiler._small_points = lambda runner, shapes: [
    profiler._fastest(runner, s, torch.arange(sum(q for _, q in s)), 3) for s in shapes]
old_cost = profiler.profile_forward(eng.runner)
profiler._small_points = passes
for name, c in (("point by point", old_cost), ("in passes", new_cost)):
    print(f"{name:15s} T(n)/T(1): " + " ".join(f"{n}:{c(n) / c(1):.3f}" for n in (1, 2, 3, 4, 5, 8, 9, 12, 16)), flush=True)
pts = SweepSettings().points
variants = [("off", "off", None), ("static:1", "static:1", None), ("static:2", "static:2", None),
            ("adaptive old", "adaptive", old_cost), ("adaptive new", "adaptive", new_cost)]
for wl, c in POINTS:
    w = prepare_workload(eng, wl, pts.items(wl), cap=pts.max_tokens_cap, scale=pts.max_tokens_scale)
    installed, res = {}, {v[0]: [] for v in variants}
    for r in range(ROUNDS):
        for name, pol, cost in variants[r % len(variants):] + variants[:r % len(variants)]:
            if name in installed:
                eng.spec_policy = installed[name]
            else:
                eng.set_speculation_policy(*parse_policy(pol, 4))
                if cost is not None:
                    eng.spec_policy.target_cost = copy.deepcopy(cost)
                installed[name] = eng.spec_policy
            eng.planner.reset()
            res[name].append(run_workload(eng, w, c, pts.num_prompts(c), pts.ignore_eos,
                                          warm_shared_prefix=True))
    print(f"{wl} c{c} ({ROUNDS} rounds, {pts.num_prompts(c)} requests a run; ratio = per-round "
          "tok/s over off's, median [min-max])")
    for name, _, _ in variants:
        rs = res[name]
        ratios = [a["output_tok_s"] / b["output_tok_s"] for a, b in zip(rs, res["off"])]
        drafted = sum(x["num_draft_tokens"] for x in rs)
        accepted = sum(x["num_accepted_tokens"] for x in rs)
        print(f"  {name:14s} tok/s {statistics.median(x['output_tok_s'] for x in rs):7.1f}  "
              f"ratio {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]  "
              f"drafted {drafted:5d}  accepted {accepted / max(drafted, 1):.2f}", flush=True)
