"""Where a step's time goes at concurrency 1 on prose: vanilla against adaptive EAGLE (s27 head)."""
import os, time
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload, warm_up
d = os.path.expanduser("~/.cache/specserve/drafts/s27-eagle")
for name, kw in (("vanilla", {}), ("eagle", dict(speculative_config={"method": "eagle", "model": d}, speculation_policy="adaptive"))):
    llm = LLM(**kw); e = llm.engine; warm_up(e)
    w = prepare_workload(e, "prose", cap=64)
    run_workload(e, w, 1, 4)
    s0 = e.get_stats(); t = time.perf_counter()
    run = run_workload(e, w, 1, 12)
    s1 = e.get_stats(); wall = time.perf_counter() - t
    dd = {k: s1[k] - s0[k] for k in ("num_steps", "draft_time_s", "spec_time_s", "forward_time_s", "step_time_s", "verify_time_s", "num_draft_tokens", "num_accepted_tokens", "num_generated_tokens", "draft_num_forwards")}
    n = dd["num_steps"]
    print(f"{name}: tok/s {run['output_tok_s']:.1f} steps {n} gen {dd['num_generated_tokens']} wall {wall:.2f}s | per step ms: step {dd['step_time_s']/n*1e3:.2f} fwd {dd['forward_time_s']/n*1e3:.2f} draft {dd['draft_time_s']/n*1e3:.2f} spec {dd['spec_time_s']/n*1e3:.2f} verify {dd['verify_time_s']/n*1e3:.2f} | drafts {dd['num_draft_tokens']} acc {dd['num_accepted_tokens']} draft fwds {dd['draft_num_forwards']}", flush=True)
    del llm, e
