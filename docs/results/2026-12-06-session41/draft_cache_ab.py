"""A/B in one engine: a draft model's own prefix cache on vs off (rag, closed loop as bench sweep runs it).
DRAFT=DIR: a trained draft (specserve train-draft --method draft) instead of the 4-layer self-draft."""
import os, statistics, sys
from specserve.bench.lab import build_llm, proposer_config, warm_up, prepare_workload, run_workload
from specserve.bench.sweep import SweepSettings, parse_policy
WL = os.environ.get("WL", "rag"); CONCS = [int(c) for c in os.environ.get("CONCS", "1,4,16").split(",")]
ROUNDS = int(os.environ.get("ROUNDS", "6"))
llm = build_llm(None, {"speculative_config": proposer_config("draft", 4, draft_model=os.environ.get("DRAFT")), "speculation_policy": "adaptive",
                       "enable_prefix_caching": True, "max_num_seqs": 128})
eng = llm.engine; warm_up(eng)
pts = SweepSettings().points
w = prepare_workload(eng, WL, pts.items(WL), cap=pts.max_tokens_cap, scale=pts.max_tokens_scale)
variants = [("off", "off", True), ("adaptive+cache", "adaptive", True), ("adaptive-nocache", "adaptive", False),
            ("static2+cache", "static:2", True), ("static2-nocache", "static:2", False)]
bm = eng.proposer.block_manager
for c in CONCS:
    installed = {}; res = {v[0]: [] for v in variants}
    for r in range(ROUNDS):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for name, pol, cache in order:
            if name in installed: eng.spec_policy = installed[name]
            else:
                eng.set_speculation_policy(*parse_policy(pol, 4)); installed[name] = eng.spec_policy
            bm.enable_prefix_caching = cache
            out = run_workload(eng, w, c, pts.num_prompts(c), pts.ignore_eos, warm_shared_prefix=True)
            res[name].append(out)
    print(f"{WL} c{c} ({ROUNDS} rounds; ratio = per-round tok/s over off's, median [min-max])")
    for name, _, _ in variants:
        rs = res[name]; ratios = [a["output_tok_s"] / b["output_tok_s"] for a, b in zip(rs, res["off"])]
        print(f"  {name:18s} tok/s {statistics.median(x['output_tok_s'] for x in rs):7.1f}  ratio {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]"
              f"  drafted {sum(x['num_draft_tokens'] for x in rs):4d}  draft time {sum(x['draft_time_s'] for x in rs):6.2f} s"
              f"  hits {sum(x.get('draft_prefix_cache_hits', 0) for x in rs)}", flush=True)
