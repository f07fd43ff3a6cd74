import sys
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload
c = int(sys.argv[1])
llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4}, speculation_policy="adaptive", kv_cache_memory=1 << 30)
eng = llm.engine
wl = prepare_workload(eng, "prose", cap=32, scale=1.0)
pols = {}
for p in ("off", "adaptive"):
    eng.set_speculation_policy(p, 4); pols[p] = eng.spec_policy
for r in range(10):
    line = []
    for p in ("off", "adaptive"):
        eng.spec_policy = pols[p]
        x = run_workload(eng, wl, c, 4 * c, warm_shared_prefix=True)
        n = x["num_steps"]
        line.append(f"{p[:3]} {x['output_tok_s']:6.1f} fwd {1e3*x['forward_time_s']/n:5.2f} oth {1e3*(x['step_time_s']-x['forward_time_s']-x['spec_time_s'])/n:4.2f} spec {1e3*x['spec_time_s']/n:4.2f} d {x['num_draft_tokens']:3d} a {x['num_accepted_tokens']:3d}")
    print(r, " | ".join(line), "| tracked", len(pols['adaptive'].acceptance.per_request), len(eng.proposer.indexes), flush=True)
