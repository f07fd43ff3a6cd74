"""Session 7: per-step (tokens, context, measured forward seconds, profile T_lin) of the embedded
model (bf16, n-gram proposer) under off / static:2 / static:4 at concurrency 1, 4, 16, 32.
Usage: .venv/bin/python step_costs.py json,rag,prose   (writes steps.json; ~3 min)"""
import json, sys, time
import numpy as np
from specserve.bench.lab import build_llm, prepare_workload, run_workload, proposer_config, warm_up
llm = build_llm(None, {"max_num_seqs": 128, "speculative_config": proposer_config("ngram", 4),
                       "speculation_policy": "adaptive"})
eng = llm.engine
rows = []
orig_schedule = eng.scheduler.schedule
ctx = {}
def sched():
    s = orig_schedule()
    ctx["ctx"] = sum(r.num_computed_tokens + n for r, n in s.scheduled)
    ctx["qctx"] = sum(n * (r.num_computed_tokens + n) for r, n in s.scheduled if r.num_computed_tokens >= r.num_prompt_tokens - 1)
    ctx["nseq"] = len(s.scheduled)
    ctx["nprefill"] = sum(n for r, n in s.scheduled if r.num_computed_tokens < r.num_prompt_tokens)
    return s
eng.scheduler.schedule = sched
warm_up(eng)
out = []
for wl in sys.argv[1].split(","):
    w = prepare_workload(eng, wl)
    for conc in (1, 4, 16, 32):
        for pol in ("off", "static:2", "static:4"):
            name, k = (pol.split(":")[0], int(pol.split(":")[1])) if ":" in pol else (pol, 4)
            eng.set_speculation_policy(name, k)
            p = eng.spec_policy
            orig = p.observe_step
            def obs(num_tokens, forward_s, dt, ds, _o=orig, _p=p, wl=wl, conc=conc, pol=pol):
                out.append(dict(wl=wl, conc=conc, pol=pol, n=num_tokens, t=forward_s, ctx=ctx["ctx"], qctx=ctx["qctx"], nseq=ctx["nseq"], npre=ctx["nprefill"], pred=float(eng._cost_models[0](num_tokens))/eng._cost_models[0].scale))
                return _o(num_tokens, forward_s, dt, ds)
            p.observe_step = obs
            run_workload(eng, w, conc, max(conc, 8), warm_shared_prefix=True)
json.dump(out, open("steps.json", "w"))
print(len(out))
