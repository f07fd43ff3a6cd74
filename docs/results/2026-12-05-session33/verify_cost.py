"""Forward time per step by its token count, prose at concurrency 1 (n-gram, 32-token replies): off, static K = 2 and
adaptive alternated on one engine, two rounds. Usage: python verify_cost.py [WORKLOAD]"""
import time, collections, sys
import numpy as np
from specserve import LLM
from specserve.bench.lab import prepare_workload, proposer_config, run_workload, warm_up
llm = LLM(speculative_config=proposer_config("ngram", 4), speculation_policy="adaptive")
e = llm.engine
r = e.runner
rec = []
orig = r.execute
def execute(inputs, *a, **k):
    t0 = time.perf_counter(); out = orig(inputs, *a, **k); rec.append((int(inputs.input_ids.shape[0]), time.perf_counter() - t0)); return out
r.execute = execute
warm_up(e)
w = prepare_workload(e, sys.argv[1] if len(sys.argv) > 1 else "prose", cap=32)
for rnd in range(2):
    for pol in ("off", "static", "adaptive"):
        e.set_speculation_policy(pol, 2 if pol == "static" else None)
        rec.clear(); t0 = time.perf_counter()
        run = run_workload(e, w, 1, 32)
        by = collections.defaultdict(list)
        for n, t in rec: by[n].append(t)
        print(pol, f"{run['output_tok_s']:.1f} tok/s", " ".join(f"n={n}:{len(v)}x{np.median(v)*1e3:.2f}ms" for n, v in sorted(by.items()) if len(v) >= 3), flush=True)
