"""Time each piece of the adaptive plan inside the engine (wrapped with perf_counter): W (env,
default prose) at concurrency C (default 4), n-gram, one warm-up run of 32 prompts, then 64."""
import time, os
from specserve import LLM
from specserve.bench.lab import prepare_workload, proposer_config, run_workload, warm_up
import specserve.spec_decode.policy as P
import specserve.spec_decode.cost_model as CM
C=int(os.environ.get("C",4)); W=os.environ.get("W","prose")
llm = LLM(speculative_config=proposer_config("ngram", 4), speculation_policy="adaptive")
e = llm.engine; warm_up(e)
w = prepare_workload(e, W, cap=32)
run_workload(e, w, C, 32)
acc = {"choose":0.0,"cnst":0.0,"est":0.0,"lookup":0.0,"propose":0.0,"observe":0.0}
cnt = {k:0 for k in acc}
def wrap(obj, name, key):
    f = getattr(obj, name)
    def g(*a, **k):
        t=time.perf_counter()
        try: return f(*a, **k)
        finally: acc[key]+=time.perf_counter()-t; cnt[key]+=1
    setattr(obj, name, g)
pol = e.spec_policy
wrap(pol, "choose", "choose")
wrap(pol.acceptance, "lower_estimates", "est")
wrap(pol, "observe_step", "observe")
wrap(e.planner, "_look_up", "lookup")  # e._look_up before session 37
wrap(e.planner, "propose", "propose")  # e._propose before session 37
orig=P.choose_num_speculative_tokens
def g(*a, **k):
    t=time.perf_counter()
    try: return orig(*a, **k)
    finally: acc["cnst"]+=time.perf_counter()-t; cnt["cnst"]+=1
P.choose_num_speculative_tokens=g
n0=e.stats.num_steps
run_workload(e, w, C, 64)
n=e.stats.num_steps-n0
print("steps", n)
for k in acc: print(f"{k:8s} calls {cnt[k]:5d}  {1e6*acc[k]/max(cnt[k],1):7.1f} us/call  {1e6*acc[k]/n:7.1f} us/step")
