"""prose / json at concurrency 32: a vanilla engine, and an EAGLE engine under off and adaptive
(switched in place), alternated; per-step costs from the engine's counters."""
import os, time, sys, resource
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload, warm_up
d = os.path.expanduser("~/.cache/specserve/drafts/s27-eagle")
wl = sys.argv[1] if len(sys.argv) > 1 else "prose"
van = LLM(); warm_up(van.engine)
eag = LLM(speculative_config={"method": "eagle", "model": d}, speculation_policy="adaptive"); warm_up(eag.engine)
wv = prepare_workload(van.engine, wl, cap=64); we = prepare_workload(eag.engine, wl, cap=64)
run_workload(eag.engine, we, 1, 4)  # as the lab: c1 first
keys = ("num_steps", "draft_time_s", "spec_time_s", "forward_time_s", "step_time_s", "num_draft_tokens", "num_accepted_tokens", "num_generated_tokens")
for rnd in range(3):
    for name, llm, w, pol in (("vanilla", van, wv, None), ("eagle-off", eag, we, "off"), ("eagle-adaptive", eag, we, "adaptive")):
        e = llm.engine
        if pol:
            e.set_speculation_policy(pol)
        f0 = resource.getrusage(resource.RUSAGE_SELF); s0 = e.get_stats(); run = run_workload(e, w, 32, 64); s1 = e.get_stats(); f1 = resource.getrusage(resource.RUSAGE_SELF)
        dd = {k: s1[k] - s0[k] for k in keys}; n = dd["num_steps"]
        print(f"r{rnd} {name:15s} tok/s {run['output_tok_s']:7.1f} steps {n} | ms/step: step {dd['step_time_s']/n*1e3:.2f} fwd {dd['forward_time_s']/n*1e3:.2f} draft {dd['draft_time_s']/n*1e3:.2f} spec {dd['spec_time_s']/n*1e3:.2f} | drafts {dd['num_draft_tokens']} minflt/step {(f1.ru_minflt-f0.ru_minflt)/n:.0f} sys {(f1.ru_stime-f0.ru_stime)/n*1e3:.2f} ms/step", flush=True)
