"""Is the EAGLE head's first guess worse right after a stretch without drafting (a catch-up)?
Adaptive engine, prose c1: position-1 acceptance of each verification, split by whether the
request's previous plan was K = 0."""
import os, sys, collections
from specserve.bench.lab import build_llm, prepare_workload, proposer_config, run_workload, warm_up
from specserve.bench.sweep import parse_policy
HEAD = os.path.expanduser("~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-eagle")
wl = sys.argv[1]; pol_name = sys.argv[2] if len(sys.argv) > 2 else "adaptive"
llm = build_llm(None, {"speculative_config": proposer_config("eagle", 4, eagle_model=HEAD),
                       "speculation_policy": "adaptive", "kv_cache_memory": "2GiB"})
e = llm.engine
warm_up(e)
if pol_name != "adaptive":
    e.set_speculation_policy(*parse_policy(pol_name, 4))
pol = e.spec_policy
work = prepare_workload(e, wl, cap=64)
plans = collections.defaultdict(list)
choose = pol.choose
def traced_choose(reqs, *a, **k):
    ks = choose(reqs, *a, **k)
    for r, kk in zip(reqs, ks):
        plans[r.request_id].append(kk)
    return ks
pol.choose = traced_choose
stats = collections.defaultdict(lambda: [0, 0])  # class -> [first accepted, verifications]
observe = pol.acceptance.observe
def traced_observe(rid, n, a):
    h = plans.get(rid, [])
    # plans[-1] is the plan this verification ran; the one before tells if the head caught up
    cls = "start" if len(h) < 2 else ("after K=0" if h[-2] == 0 else "steady")
    stats[cls][0] += a > 0; stats[cls][1] += 1
    observe(rid, n, a)
pol.acceptance.observe = traced_observe
out = run_workload(e, work, 1, 16, False, warm_shared_prefix=True)
print(wl, pol_name, "tok/s", round(out["output_tok_s"], 1))
for cls, (acc, n) in sorted(stats.items()):
    print(f"  {cls:10s} position-1 accepted {acc}/{n} = {acc / max(n, 1):.2f}")
