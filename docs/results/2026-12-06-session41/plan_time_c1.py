"""Wall time of the policy's pieces per step (no profiler): wraps methods with perf_counter.
WL (prose), P (draft), CONC (1), POLICIES (adaptive; e.g. off,adaptive runs them in turn on one
engine, each run with a fresh policy)."""
import os, time, functools, collections
from specserve.bench.lab import build_llm, proposer_config, warm_up, prepare_workload, run_workload
from specserve.bench.sweep import SweepSettings
import specserve.spec_decode.policy as pol, specserve.spec_decode.cost_model as cm, specserve.spec_decode.acceptance as acc
import specserve.engine.spec_planner as sp
T = collections.Counter(); N = collections.Counter()
def wrap(obj, name, label):
    f = getattr(obj, name)
    @functools.wraps(f)
    def g(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally: T[label] += time.perf_counter() - t; N[label] += 1
    setattr(obj, name, g)
wrap(sp.SpeculationPlanner, "propose", "planner.propose")
wrap(pol.AdaptivePolicy if hasattr(pol, "AdaptivePolicy") else pol.SpecPolicy, "choose", "policy.choose")
wrap(pol.SpecPolicy, "observe_step", "observe_step")
wrap(cm, "choose_num_speculative_tokens", "choose_k"); 
if hasattr(cm, "choose_for_one_request"):  # from 40f93c4
    wrap(cm, "choose_for_one_request", "choose_one"); pol.choose_for_one_request = cm.choose_for_one_request
pol.choose_num_speculative_tokens = cm.choose_num_speculative_tokens
wrap(acc.AcceptanceTracker, "sample_prior", "sample_prior")
import specserve.spec_decode.draft_model as dm, specserve.engine.scheduler as sch
wrap(dm.DraftModelProposer, "catch_up_tokens", "catch_up_tokens")
wrap(sch.Scheduler, "pending_prefill_tokens", "pending_prefill")
wrap(pol.SpecPolicy, "record_choice", "record_choice")
wrap(sp.SpeculationPlanner, "_choose", "planner._choose")
wrap(sp.SpeculationPlanner, "_look_up", "planner._look_up")
wrap(sp.SpeculationPlanner, "_set_shadow", "planner._set_shadow")
import specserve.spec_decode.ngram as ng
wrap(ng.NgramProposer, "propose", "ngram.propose")
wrap(acc.AcceptanceTracker, "estimates", "estimates"); 
if hasattr(acc.AcceptanceTracker, "estimate_row"):
    wrap(acc.AcceptanceTracker, "estimate_row", "estimate_row")
wl = os.environ.get("WL", "prose"); prop = os.environ.get("P", "draft"); C = int(os.environ.get("CONC", "1"))
POLICIES = os.environ.get("POLICIES", "adaptive").split(",")
llm = build_llm(None, {"speculative_config": proposer_config(prop, 4), "speculation_policy": "adaptive",
                       "enable_prefix_caching": True, "max_num_seqs": 128})
eng = llm.engine; warm_up(eng)
pts = SweepSettings().points
w = prepare_workload(eng, wl, pts.items(wl), cap=pts.max_tokens_cap, scale=pts.max_tokens_scale)
for r in range(3):
  for pol_name in POLICIES:
    if len(POLICIES) > 1:
        eng.set_speculation_policy(pol_name)
    T.clear(); N.clear()
    res = run_workload(eng, w, C, pts.num_prompts(C), pts.ignore_eos, warm_shared_prefix=True)
    steps = res.get("num_steps") or 248
    print(r, pol_name, "tok/s %.1f spec %.1f ms draft %.1f ms step %.0f ms K %s" % (res["output_tok_s"], 1e3*res["spec_time_s"], 1e3*res["draft_time_s"], 1e3*res["step_time_s"], res["spec_k_histogram"]))
    for k in T: print("   %-18s %6d calls %7.1f us/call" % (k, N[k], 1e6*T[k]/N[k]))
