import os, time, sys
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload, warm_up
d = os.path.expanduser("~/.cache/specserve/drafts/s27-eagle")
q = sys.argv[1] if sys.argv[1] != "none" else None
spec = {"method": "eagle", "model": d}
if q: spec["quantization"] = q
llm = LLM(speculative_config=spec, speculation_policy="adaptive"); e = llm.engine; warm_up(e)
print(q, {type(m).__name__ for m in e.proposer.model.modules()})
w = prepare_workload(e, "prose", cap=64)
run_workload(e, w, 1, 4)
keys = ("num_steps", "draft_time_s", "forward_time_s", "step_time_s", "num_draft_tokens", "num_accepted_tokens", "num_generated_tokens")
for r in range(2):
    s0 = e.get_stats(); run = run_workload(e, w, 1, 12); s1 = e.get_stats()
    dd = {k: s1[k] - s0[k] for k in keys}; n = dd["num_steps"]
    print(f"{q}: tok/s {run['output_tok_s']:.1f} steps {n} | step {dd['step_time_s']/n*1e3:.2f} fwd {dd['forward_time_s']/n*1e3:.2f} draft {dd['draft_time_s']/n*1e3:.2f} ms | per draft {dd['draft_time_s']/max(dd['num_draft_tokens'],1)*1e3:.2f} ms | drafts {dd['num_draft_tokens']} acc {dd['num_accepted_tokens']} ({dd['num_accepted_tokens']/max(dd['num_draft_tokens'],1):.2f})", flush=True)
