"""Is a later engine in the same process slower? Build the same vanilla engine 3 times in a row
(each freed before the next) and run prose at c=32 on each, twice.
Run: HF_HUB_OFFLINE=1 .venv/bin/python docs/results/2026-11-30-session3/order_check.py"""

import gc

from specserve.bench.lab import build_llm, prepare_workload, run_workload, warm_up

workload = None
for i in range(3):
    llm = build_llm(None, {"max_num_seqs": 128})
    warm_up(llm.engine)
    workload = workload or prepare_workload(llm.engine, "prose", cap=64)
    for r in range(2):
        res = run_workload(llm.engine, workload, 32, 64)
        print(f"engine {i} run {r}: {res['output_tok_s']:.0f} tok/s, "
              f"forward {res['forward_time_s']:.2f}s", flush=True)
    del llm
    gc.collect()
