"""A/B in one engine: the adaptive n-gram controller with and without the match-length evidence
(evidence_factor forced to 1.0 for the 'without' variant), beside off and static:2, closed loops
as bench sweep runs them (3 waves, 32-token replies, rag's document warmed). Each variant keeps
its own policy object (its own acceptance record) across rounds; the order rotates per round.
POINTS=prose:4,json:4,... ROUNDS=N."""
import os, statistics
from specserve.bench.lab import build_llm, proposer_config, warm_up, prepare_workload, run_workload
from specserve.bench.sweep import SweepSettings, parse_policy

POINTS = [(p.split(":")[0], int(p.split(":")[1])) for p in
          os.environ.get("POINTS", "prose:4,json:4,rag:8,rag:16").split(",")]
ROUNDS = int(os.environ.get("ROUNDS", "4"))
llm = build_llm(None, {"speculative_config": proposer_config("ngram", 4),
                       "speculation_policy": "adaptive", "enable_prefix_caching": True,
                       "max_num_seqs": 128})
eng = llm.engine
warm_up(eng)
pts = SweepSettings().points
variants = [("off", "off", True), ("static:2", "static:2", True),
            ("adaptive+evidence", "adaptive", True), ("adaptive-evidence", "adaptive", False)]
for wl, c in POINTS:
    w = prepare_workload(eng, wl, pts.items(wl), cap=pts.max_tokens_cap, scale=pts.max_tokens_scale)
    installed, res = {}, {v[0]: [] for v in variants}
    for r in range(ROUNDS):
        for name, pol, evidence in variants[r % len(variants):] + variants[:r % len(variants)]:
            if name in installed:
                eng.spec_policy = installed[name]
            else:
                eng.set_speculation_policy(*parse_policy(pol, 4))
                installed[name] = eng.spec_policy
                if not evidence:
                    eng.spec_policy.acceptance.evidence_factor = lambda rid, e: 1.0
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
        print(f"  {name:18s} tok/s {statistics.median(x['output_tok_s'] for x in rs):7.1f}  "
              f"ratio {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]  "
              f"drafted {drafted:5d}  accepted {accepted / max(drafted, 1):.2f}  "
              f"spec share {sum(x['spec_time_s'] for x in rs) / sum(x['step_time_s'] for x in rs):.2%}",
              flush=True)
    ev = installed["adaptive+evidence"].acceptance.evidence_rates()
    print("  first-guess acceptance by match length (adaptive+evidence):",
          {k: round(v, 2) for k, v in ev.items()}, flush=True)
