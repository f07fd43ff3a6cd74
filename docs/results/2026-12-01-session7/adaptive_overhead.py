"""Session 7: off vs adaptive on one engine, alternating, with the time the engine spends in
_propose (policy + guesses) and in the policy's observe_step per step.
Usage: .venv/bin/python adaptive_overhead.py ngram prose 16 96   (proposer workload conc prompts)"""
import time, sys, statistics
from specserve.bench.lab import build_llm, prepare_workload, run_workload, proposer_config, warm_up
prop = sys.argv[1]; wl = sys.argv[2]; conc = int(sys.argv[3]); n = int(sys.argv[4])
llm = build_llm(None, {"max_num_seqs": 128, "speculative_config": proposer_config(prop, 4), "speculation_policy": "adaptive"})
eng = llm.engine
warm_up(eng)
w = prepare_workload(eng, wl)
acc = {}
orig_prop = eng._propose
def timed_prop():
    t = time.perf_counter(); orig_prop(); acc["prop"] = acc.get("prop", 0) + time.perf_counter() - t
eng._propose = timed_prop
res = {"off": [], "adaptive": []}
for rnd in range(3):
    for pol in (("off", "adaptive") if rnd % 2 == 0 else ("adaptive", "off")):
        eng.set_speculation_policy(pol, 4)
        p = eng.spec_policy; o = p.observe_step
        def obs(*a, _o=o):
            t = time.perf_counter(); _o(*a); acc["obs"] = acc.get("obs", 0) + time.perf_counter() - t
        p.observe_step = obs
        acc.clear()
        r = run_workload(eng, w, conc, n, warm_shared_prefix=True)
        res[pol].append(r["output_tok_s"])
        print(pol, round(r["output_tok_s"], 1), "steps", r["num_steps"], "K", r["spec_k_histogram"], "propose %.3f ms/step  observe %.3f ms/step" % (1e3 * acc.get("prop", 0) / r["num_steps"], 1e3 * acc.get("obs", 0) / r["num_steps"]), "step-fwd %.3f ms" % (1e3 * (r["step_time_s"] - r["forward_time_s"]) / r["num_steps"]), "fwd %.2f ms" % (1e3 * r["forward_time_s"] / r["num_steps"]))
print({k: round(statistics.median(v), 1) for k, v in res.items()})
