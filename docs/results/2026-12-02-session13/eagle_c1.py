"""EAGLE json/rag at concurrency 1: adaptive vs static:2 vs static:4 on one engine, rounds
rotated; prints tok/s, TPOT, acceptance, K histogram, per-position acceptance per policy."""
import statistics, sys, os
from specserve.bench.lab import build_llm, prepare_workload, proposer_config, run_workload, warm_up
from specserve.bench.sweep import parse_policy
HEAD = os.path.expanduser("~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-eagle")
wl, conc, n, rounds, cap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
llm = build_llm(None, {"speculative_config": proposer_config("eagle", 4, eagle_model=HEAD),
                      "speculation_policy": "adaptive", "enable_prefix_caching": True,
                      "kv_cache_memory": 2 << 30})
e = llm.engine
warm_up(e)
w = prepare_workload(e, wl, cap=cap)
pols = ["static:2", "static:4", "adaptive"]
inst, res = {}, {p: [] for p in pols}
for r in range(rounds):
    for p in pols[r % 3:] + pols[:r % 3]:
        if p in inst: e.spec_policy = inst[p]
        else:
            e.set_speculation_policy(*parse_policy(p, 4)); inst[p] = e.spec_policy
        before = dict(e.spec_policy.k_histogram)
        d0, a0, v0 = e.stats.num_draft_tokens, e.stats.num_accepted_tokens, e.stats.num_verifications
        out = run_workload(e, w, conc, n, False, warm_shared_prefix=True)
        hist = {k: c - before.get(k, 0) for k, c in e.spec_policy.k_histogram.items()}
        d, a, v = e.stats.num_draft_tokens - d0, e.stats.num_accepted_tokens - a0, e.stats.num_verifications - v0
        res[p].append(out["output_tok_s"])
        print(f"r{r} {p:9s} tok/s {out['output_tok_s']:6.1f} tpot {out.get('tpot_p50_ms', 0):5.1f} "
              f"acc {a/max(d,1):.2f} len {(a+v)/max(v,1):.2f} K {dict(sorted(hist.items()))} "
              f"pos {[round(float(x),2) for x in e.spec_policy.acceptance.global_rates]}", flush=True)
for p in pols:
    print(p, "median tok/s", round(statistics.median(res[p]), 1), res[p])
