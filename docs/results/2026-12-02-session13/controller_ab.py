"""The controller before and after this session's two changes, in one process on one EAGLE
engine, rounds rotated: `adaptive-old` (the all-zero plan keyed on batch size only, no probe of
position K + 1) against `adaptive` (keyed on members in small batches, probe every 8th plan),
next to off and static:2.
usage: python controller_ab.py WORKLOADS CONCURRENCIES PROMPTS ROUNDS CAP"""
import os, statistics, subprocess, sys, textwrap, types
from specserve.engine import llm_engine
from specserve.bench.lab import build_llm, prepare_workload, proposer_config, run_workload, warm_up
from specserve.bench.sweep import parse_policy

HEAD = os.path.expanduser("~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-eagle")
src = subprocess.run(["git", "show", "a0d3e8f:specserve/engine/llm_engine.py"], capture_output=True,
                     text=True, check=True, cwd=os.path.dirname(llm_engine.__file__)).stdout
start = src.index("    def _plan_then_look_up")
body = textwrap.dedent(src[start:src.index("    def _look_up")])
ns = dict(vars(llm_engine))
exec(body, ns)
old_plan = ns["_plan_then_look_up"]

workloads, concs = sys.argv[1].split(","), [int(c) for c in sys.argv[2].split(",")]
n, rounds, cap = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
llm = build_llm(None, {"speculative_config": proposer_config("eagle", 4, eagle_model=HEAD),
                       "speculation_policy": "adaptive", "enable_prefix_caching": True,
                       "kv_cache_memory": 2 << 30})
e = llm.engine
warm_up(e)
variants = ["off", "static:2", "adaptive-old", "adaptive"]
new_plan = e._plan_then_look_up
for w in workloads:
    work = prepare_workload(e, w, cap=cap)
    installed = {}
    for c in concs:
        res = {v: [] for v in variants}
        ks = {v: {} for v in variants}
        for r in range(rounds):
            for v in variants[r % 4:] + variants[:r % 4]:
                if v not in installed:
                    e.set_speculation_policy(*parse_policy(v.removesuffix("-old"), 4))
                    if v == "adaptive-old":
                        e.spec_policy._probe = lambda ks, k_max: None
                    installed[v] = e.spec_policy
                e.spec_policy = installed[v]
                e._plan_then_look_up = types.MethodType(old_plan, e) if v == "adaptive-old" else new_plan
                e._idle_plan = None
                before = dict(e.spec_policy.k_histogram)
                out = run_workload(e, work, c, max(n, 2 * c), False, warm_shared_prefix=True)
                res[v].append(out["output_tok_s"])
                for k, cnt in e.spec_policy.k_histogram.items():
                    ks[v][k] = ks[v].get(k, 0) + cnt - before.get(k, 0)
        med = {v: statistics.median(res[v]) for v in variants}
        best = max(med[v] for v in ("off", "static:2"))
        print(f"{w} c{c}: " + "  ".join(f"{v} {med[v]:.1f} {[round(x, 1) for x in res[v]]}" for v in variants), flush=True)
        print(f"   adaptive-old/best {med['adaptive-old'] / best:.2f}  adaptive/best {med['adaptive'] / best:.2f}  "
              f"adaptive/adaptive-old {med['adaptive'] / med['adaptive-old']:.2f}  K old {dict(sorted(ks['adaptive-old'].items()))} new {dict(sorted(ks['adaptive'].items()))}", flush=True)
