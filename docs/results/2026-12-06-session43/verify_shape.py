"""A verification of K drafts is one sequence x (K + 1) query tokens; the start-up profile times
n sequences x 1 token. Times both kinds of shape round-robin, so that they share the VM's noise,
at the profile's context (96) and at 300: the median of REPS forwards per shape, in ms and over
one sequence x 1 token."""
import os, statistics, time
import torch
from specserve.bench.lab import build_llm, warm_up
from specserve.spec_decode.profiler import _fake_seq

REPS = int(os.environ.get("REPS", "60"))
llm = build_llm(None, {"enable_prefix_caching": True, "max_num_seqs": 128})
eng = llm.engine
warm_up(eng)
runner = eng.runner

def shape(nseq, q, ctx):
    return runner.prepare([(_fake_seq(runner, i, ctx, q), q) for i in range(nseq)])

def t(inputs, rows):
    t0 = time.perf_counter()
    runner.execute(inputs, torch.arange(rows))
    return time.perf_counter() - t0

SHAPES = [("1 seq x 1", 1, 1), ("1 seq x 2", 1, 2), ("1 seq x 3", 1, 3), ("1 seq x 5", 1, 5),
          ("2 seq x 1", 2, 1), ("3 seq x 1", 3, 1), ("5 seq x 1", 5, 1)]
for ctx in (96, 300):
    inputs = [(label, shape(nseq, q, ctx), nseq * q) for label, nseq, q in SHAPES]
    times = {label: [] for label, _, _ in SHAPES}
    for r in range(REPS):  # round-robin: every shape sees the same noise
        for label, inp, rows in inputs[r % len(inputs):] + inputs[:r % len(inputs)]:
            times[label].append(t(inp, rows))
    base = statistics.median(times["1 seq x 1"])
    print(f"context {ctx}: median of {REPS} round-robin forwards, ms (and over 1 seq x 1)")
    for label, v in times.items():
        m = statistics.median(v)
        print(f"  {label}: {1e3 * m:6.2f}  {m / base:5.3f}", flush=True)
