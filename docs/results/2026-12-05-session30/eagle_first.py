import os, time, sys, resource
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload, warm_up
d = os.path.expanduser("~/.cache/specserve/drafts/s27-eagle")
wl = "prose"
eag = LLM(speculative_config={"method": "eagle", "model": d}, speculation_policy="adaptive"); warm_up(eag.engine)
we = prepare_workload(eag.engine, wl, cap=64)
if os.environ.get("C1"): run_workload(eag.engine, we, 1, 4)
keys = ("num_steps", "draft_time_s", "spec_time_s", "forward_time_s", "step_time_s", "num_draft_tokens")
e = eag.engine
for rnd in range(4):
    s0 = e.get_stats(); run = run_workload(e, we, 32, 64); s1 = e.get_stats()
    dd = {k: s1[k] - s0[k] for k in keys}; n = dd["num_steps"]
    print(f"r{rnd} C1={os.environ.get('C1','')} tok/s {run['output_tok_s']:7.1f} steps {n} | ms/step: step {dd['step_time_s']/n*1e3:.2f} fwd {dd['forward_time_s']/n*1e3:.2f} draft {dd['draft_time_s']/n*1e3:.2f} spec {dd['spec_time_s']/n*1e3:.2f} drafts {dd['num_draft_tokens']}", flush=True)
