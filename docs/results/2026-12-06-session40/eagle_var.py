"""Static K = 1, 2, 4, off and adaptive variants, interleaved in one engine, ROUNDS rounds.
M=eagle (the session-39 head, unseen prompts) or M=ngram; WL workload; C concurrency; CAP reply
tokens; NP requests per run; VARS="name=w:3,gd:0.95,replan:8;..." adaptive variants (w: a fixed
prior weight; gd: global decay; replan: REPLAN_STEPS). Run from the repo root."""
import collections, os, sys, statistics
import numpy as np
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload
from specserve.bench.trained import unseen_items
import specserve.spec_decode.cost_model as cm
head = os.path.expanduser("~/.cache/specserve/drafts/s39-eagle")
W = os.environ.get("WL", "prose"); C = int(os.environ.get("C", "1"))
M = os.environ.get("M", "eagle")
llm = LLM(speculative_config={"method": M, "num_speculative_tokens": 4} | ({"model": head} if M == "eagle" else {}),
          speculation_policy="adaptive", kv_cache_memory=1 << 30)
eng = llm.engine
from specserve.bench.workloads import load_workload
wl = prepare_workload(eng, W, unseen_items(W, [head]) if M == "eagle" else load_workload(W), cap=int(os.environ.get("CAP", "64")), scale=1.0)
run_workload(eng, wl, C, 2 * C)
VARS = {
    "off": ("off", {}), "K1": ("static1", {}), "K2": ("static2", {}), "K4": ("static4", {}),
    "adaptive": ("adaptive", {}),
}
for spec in os.environ.get("VARS", "").split(";"):
    if spec:
        name, _, kv = spec.partition("=")
        VARS[name] = ("adaptive", dict(x.split(":") for x in kv.split(",")))
res = collections.defaultdict(list); info = collections.defaultdict(list)
ROUNDS = int(os.environ.get("ROUNDS", "4"))
import random; rng = random.Random(0)
for r in range(ROUNDS):
    names = list(VARS); rng.shuffle(names)
    for name in names:
        pol, kw = VARS[name]
        if pol.startswith("static"):
            eng.set_speculation_policy("static", int(pol[6:]))
        else:
            eng.set_speculation_policy(pol, 4)
        a = eng.spec_policy.acceptance
        import specserve.engine.spec_planner as SP
        SP.REPLAN_STEPS = int(kw.get("replan", "8"))
        if "w" in kw:
            a.prior_weight = float(kw["w"]); a.fit_prior_weight = False
        a.global_decay = float(kw.get("gd", "0.99"))

        for k, v in kw.items():
            if k in ("prior_weightX", "global_decay", "decay"):
                setattr(a, k, float(v))
        mg = float(kw.get("min_gain", 0.03))
        old = cm.choose_num_speculative_tokens.__defaults__
        d = list(old); d[list(old).index(0.03)] = mg  # min_gain default
        cm.choose_num_speculative_tokens.__defaults__ = tuple(d)
        x = run_workload(eng, wl, C, int(os.environ.get('NP', max(10, 3 * C))), warm_shared_prefix=True)
        cm.choose_num_speculative_tokens.__defaults__ = old
        info.setdefault(name + "_w", []).append(eng.spec_policy.acceptance.prior_weight); res[name].append(x["output_tok_s"]); info[name].append((x["spec_k_mean"], x["acceptance_rate"] or 0, x["num_steps"], x["num_draft_tokens"], x["num_accepted_tokens"], x["output_tokens"]))
    print(r, {n: round(v[-1], 1) for n, v in res.items()}, flush=True)
print(f"{W} c{C}, {ROUNDS} rounds: median of per-round ratio to off [min-max]; K mean; acceptance")
for n in VARS:
    rat = [a / b for a, b in zip(res[n], res["off"])]
    print(f"  {n:12s} {statistics.median(rat):.3f} [{min(rat):.3f}-{max(rat):.3f}]  K {np.mean([i[0] for i in info[n]]):.2f} acc {np.mean([i[1] for i in info[n]]):.2f} steps {np.mean([i[2] for i in info[n]]):.0f} drafted {np.mean([i[3] for i in info[n]]):.0f} accepted {np.mean([i[4] for i in info[n]]):.0f} tokens/step {np.sum([i[5] for i in info[n]])/np.sum([i[2] for i in info[n]]):.3f} w {info[n + '_w']}")
