"""Where adaptive's K = 0 plans fall in a request (EAGLE, c1): plan index from the request's
start and tokens left, with the plan's inputs (rates, catch-up, horizon, goodput per K)."""
import os, sys, collections
from specserve.bench.lab import build_llm, prepare_workload, proposer_config, run_workload, warm_up
from specserve.spec_decode import cost_model as cm
HEAD = os.path.expanduser("~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-eagle")
wl = sys.argv[1]
llm = build_llm(None, {"speculative_config": proposer_config("eagle", 4, eagle_model=HEAD),
                       "speculation_policy": "adaptive", "kv_cache_memory": "2GiB"})
e = llm.engine
warm_up(e)
work = prepare_workload(e, wl, cap=64)
pol = e.spec_policy
count = collections.Counter()
seen = []
choose = pol.choose
def traced(reqs, *a, **k):
    ks = choose(reqs, *a, **k)
    for r, kk in zip(reqs, ks):
        count[r.request_id] += 1
        if kk == 0:
            seen.append((count[r.request_id], r.max_tokens - r.num_output_tokens,
                         [round(float(x), 2) for x in pol.acceptance.estimate(r.request_id)]))
    return ks
pol.choose = traced
orig = cm._choose_one
zero_inputs = []
def traced_one(rates, k_max, nbt, tc, dc, catch_up, horizon, prev, *rest):
    out = orig(rates, k_max, nbt, tc, dc, catch_up, horizon, prev, *rest)
    if out[0] == 0:
        zero_inputs.append((k_max, catch_up, horizon, prev))
    return out
cm._choose_one = traced_one
run_workload(e, work, 1, 16, False, warm_shared_prefix=True)
print("K = 0 plans:", len(seen), "of", sum(count.values()))
print("by plan index in its request:", sorted(collections.Counter(i for i, _, _ in seen).items())[:20])
print("by tokens left:", sorted(collections.Counter(t for _, t, _ in seen).items())[:20])
print("examples (index, tokens left, estimates):", seen[:12])
print("scalar plans that chose 0 (k_max, catch_up, horizon, prev):", collections.Counter(zero_inputs).most_common(8))
