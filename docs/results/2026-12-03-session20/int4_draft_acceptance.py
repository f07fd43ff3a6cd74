"""Served greedy acceptance of a trained draft with its weights bf16 / int8 / int4 rounded to
nearest / int4 by GPTQ on the draft's calibration sample (what `quantization: "int4"` does for a
draft directory from train-draft since session 20) / int4 with the LM head left bf16: static
K=2, c1, 8 requests per workload (deterministic: one round). Also the time to build the engine.
python int4_draft_acceptance.py DRAFT_DIR [WORKLOADS] [VARIANTS]"""
import os
import sys
import time

import specserve.quant.swap as swap
from specserve.bench.lab import build_llm, prepare_workload, proposer_config, run_workload, warm_up

DRAFT = os.path.expanduser(sys.argv[1])
workloads = sys.argv[2].split(",") if len(sys.argv) > 2 else ["prose", "json", "sql", "rag"]
variants = (sys.argv[3].split(",") if len(sys.argv) > 3
            else ["none", "int8", "int4-rtn", "int4-gptq"])
quantize_model = swap.quantize_model


def round_to_nearest(model, method, **kw):  # drop the calibration: int4 rounds to nearest
    return quantize_model(model, method)


for v in variants:
    cfg = proposer_config("draft", 2, draft_model=DRAFT)
    if v != "none":
        cfg["quantization"] = v.split("-")[0]
    swap.quantize_model = round_to_nearest if v == "int4-rtn" else quantize_model
    swap.INT8_HEAD_METHODS = ("int8",) if v.endswith("bf16head") else ("int8", "int4")
    t0 = time.perf_counter()
    llm = build_llm(None, {"speculative_config": cfg, "speculation_policy": "static",
                           "kv_cache_memory": "1GiB"})
    build = time.perf_counter() - t0
    warm_up(llm.engine)
    for w in workloads:
        work = prepare_workload(llm.engine, w, cap=32)
        out = run_workload(llm.engine, work, 1, 8, False, warm_shared_prefix=True)
        print(f"{v:10} {w:6} acceptance {out['acceptance_rate']:.3f}  (engine built in "
              f"{build:.1f} s)", flush=True)
    del llm
