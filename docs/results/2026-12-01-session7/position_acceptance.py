"""Session 7: conditional acceptance of each draft position, P(j accepted | 1..j-1 were), for
the n-gram proposer at static K = 4, concurrency 4, on rag / json / prose.
Usage: .venv/bin/python position_acceptance.py   (~1 min)"""
import numpy as np, collections
from specserve.bench.lab import build_llm, prepare_workload, run_workload, proposer_config, warm_up
llm = build_llm(None, {"max_num_seqs": 128, "speculative_config": proposer_config("ngram", 4), "speculation_policy": "static"})
eng = llm.engine
warm_up(eng)
for wl in ("rag", "json", "prose"):
    w = prepare_workload(eng, wl)
    eng.set_speculation_policy("static", 4)
    recs = []
    p = eng.spec_policy
    orig = p.observe_verification
    p.observe_verification = lambda req, nd, na, _o=orig: (recs.append((nd, na)), _o(req, nd, na))
    run_workload(eng, w, 4, 16, warm_shared_prefix=True)
    succ = np.zeros(5); trials = np.zeros(5)
    for nd, na in recs:
        for j in range(1, nd + 1):
            if j <= na: succ[j] += 1; trials[j] += 1
            else: trials[j] += 1; break
    lens = collections.Counter(nd for nd, _ in recs)
    print(wl, "verifications", len(recs), "draft lens", dict(sorted(lens.items())), "cond acc per pos", np.round(succ[1:] / np.maximum(trials[1:], 1), 2), "trials", trials[1:])
