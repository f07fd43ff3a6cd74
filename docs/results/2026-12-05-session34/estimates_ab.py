"""The lower estimates in numpy (as shipped) and in plain Python lists, alternated on one engine:
prose (W) at concurrency C (default 4), adaptive, n-gram, 6 rounds of 32 prompts; prints the
speculation work per step."""
import os, statistics
import numpy as np
from specserve import LLM
from specserve.bench.lab import prepare_workload, proposer_config, run_workload, warm_up
from specserve.spec_decode.acceptance import AcceptanceTracker
def old_ew(self, request_ids):
    p, w = self.num_positions, self.prior_weight
    counts = np.array([self.per_request.get(r, self._none) for r in request_ids]).reshape(len(request_ids), 2 * p)
    trials = counts[:, p:] + w
    return (counts[:, :p] + w * self.global_rates) / trials, trials
def old_lower(self, request_ids, z=1.0):
    est, trials = old_ew(self, request_ids)
    own = np.maximum(trials - self.prior_weight, 0.0)
    return np.clip(est - z * np.sqrt(own * est * (1 - est)) / trials, 0.0, 1.0)
import math
def new_lower(self, request_ids, z=1.0):  # the plain-Python form that was tried
    p, w = self.num_positions, self.prior_weight
    g = [s / t for s, t in zip(self.global_succ, self.global_trials)]
    out = []
    for r in request_ids:
        c = self.per_request.get(r, self._none)
        row = []
        for j in range(p):
            trials = c[p + j] + w
            est = (c[j] + w * g[j]) / trials
            own = c[p + j]
            row.append(min(max(est - z * math.sqrt(own * est * (1 - est)) / trials, 0.0), 1.0))
        out.append(row)
    return np.array(out)
C = int(os.environ.get("C", 4)); W = os.environ.get("W", "prose")
llm = LLM(speculative_config=proposer_config("ngram", 4), speculation_policy="adaptive", enable_prefix_caching=True, max_num_seqs=128)
e = llm.engine; warm_up(e); w = prepare_workload(e, W, cap=32)
spec = {"numpy": [], "python": []}
for r in range(6):
    for side in ("numpy", "python") if r % 2 == 0 else ("python", "numpy"):
        AcceptanceTracker.lower_estimates = old_lower if side == "numpy" else new_lower
        s0, n0 = e.stats.spec_time, e.stats.num_steps
        run = run_workload(e, w, C, 32, warm_shared_prefix=True)
        n = e.stats.num_steps - n0
        spec[side].append(1e3 * (e.stats.spec_time - s0) / n)
        print(side, W, C, round(run["output_tok_s"], 1), round(spec[side][-1], 3), flush=True)
for s in spec: print("median", s, round(statistics.median(spec[s]), 3), "ms/step")
