"""Measured draft time per proposal at static K = 1, 2, 3 (EAGLE head, prose c1, one engine),
against what the adaptive cost model charges (k * draft_cost(1))."""
import os, statistics
from specserve.bench.lab import build_llm, prepare_workload, proposer_config, run_workload, warm_up
from specserve.bench.sweep import parse_policy
HEAD = os.path.expanduser("~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-eagle")
llm = build_llm(None, {"speculative_config": proposer_config("eagle", 4, eagle_model=HEAD),
                       "speculation_policy": "adaptive", "kv_cache_memory": "2GiB"})
e = llm.engine
warm_up(e)
dc = e.spec_policy.draft_cost
print("model: draft_cost(1) = %.2f ms" % (1e3 * float(dc(1))))
work = prepare_workload(e, "prose", cap=64)
res = {}
for r in range(int(os.environ.get('ROUNDS', '2'))):
    for k in (1, 2, 3):
        e.set_speculation_policy(*parse_policy(f"static:{k}", 4))
        a0 = e.stats.num_accepted_tokens
        s0 = (e.stats.draft_time, e.stats.num_verifications, e.stats.step_time if hasattr(e.stats, "step_time") else 0.0, e.stats.forward_time)
        out = run_workload(e, work, 1, 8, False, warm_shared_prefix=True)
        dt = e.stats.draft_time - s0[0]; nv = e.stats.num_verifications - s0[1]; ft = e.stats.forward_time - s0[3]
        res.setdefault(k, []).append((1e3 * dt / nv, 1e3 * ft / nv, out["output_tok_s"]))
        print(f"r{r} static:{k} draft ms/verification {1e3*dt/nv:.2f}  forward ms/verification {1e3*ft/nv:.2f}  tok/s {out['output_tok_s']:.1f}  accepted/verification {(e.stats.num_accepted_tokens - a0) / nv:.3f}", flush=True)
