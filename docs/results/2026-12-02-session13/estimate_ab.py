"""Why adaptive picks K = 1 where static:2 wins at concurrency 1: variants of the adaptive
policy in one EAGLE engine, rounds rotated. `adaptive-nohyst`: no hysteresis (prev_total unset
before every plan); `adaptive-pw20`: each request's estimate weighs the global rates as 20
trials instead of 3. usage: python estimate_ab.py WORKLOADS CONCURRENCIES PROMPTS ROUNDS CAP"""
import os, statistics, sys
from specserve.bench.lab import build_llm, prepare_workload, proposer_config, run_workload, warm_up
from specserve.bench.sweep import parse_policy

HEAD = os.path.expanduser("~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-eagle")
workloads, concs = sys.argv[1].split(","), [int(c) for c in sys.argv[2].split(",")]
n, rounds, cap = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
llm = build_llm(None, {"speculative_config": proposer_config("eagle", 4, eagle_model=HEAD),
                       "speculation_policy": "adaptive", "kv_cache_memory": "2GiB"})
e = llm.engine
warm_up(e)
variants = ["static:2", "adaptive", "adaptive-nohyst", "adaptive-pw20"]


def no_hysteresis(pol):
    choose = pol.choose
    def wrapped(*args, **kwargs):
        pol.prev_total = None
        return choose(*args, **kwargs)
    pol.choose = wrapped


for w in workloads:
    work = prepare_workload(e, w, cap=cap)
    installed = {}
    for c in concs:
        res = {v: [] for v in variants}
        ks = {v: {} for v in variants}
        for r in range(rounds):
            for v in variants[r % 4:] + variants[:r % 4]:
                if v not in installed:
                    e.set_speculation_policy(*parse_policy(v.split("-")[0], 4))
                    pol = e.spec_policy
                    if v == "adaptive-nohyst":
                        no_hysteresis(pol)
                    if v == "adaptive-pw20":
                        pol.acceptance.prior_weight = 20.0
                    installed[v] = pol
                e.spec_policy = installed[v]
                e._idle_plan = None
                before = dict(e.spec_policy.k_histogram)
                out = run_workload(e, work, c, max(n, 2 * c), False, warm_shared_prefix=True)
                res[v].append(out["output_tok_s"])
                for k, cnt in e.spec_policy.k_histogram.items():
                    ks[v][k] = ks[v].get(k, 0) + cnt - before.get(k, 0)
        med = {v: statistics.median(res[v]) for v in variants}
        print(f"{w} c{c}: " + "  ".join(f"{v} {med[v]:.1f} {[round(x, 1) for x in res[v]]}" for v in variants), flush=True)
        print("   " + "  ".join(f"{v}/static:2 {med[v] / med['static:2']:.2f} K {dict(sorted(ks[v].items()))}" for v in variants[1:]), flush=True)
