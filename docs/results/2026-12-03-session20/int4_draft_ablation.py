"""Which of the trained draft's matrices cost its acceptance under int4: quantize all but one
group of modules (kept bf16), serve at static K=2, greedy, c1, 8 json requests."""
import functools
import os
import sys

import specserve.quant.swap as swap
from specserve.bench.lab import build_llm, prepare_workload, proposer_config, run_workload, warm_up

DRAFT = os.path.expanduser("~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-3")
workload = sys.argv[1] if len(sys.argv) > 1 else "json"
SKIPS = {
    "all int4": (),
    "layers.0 bf16": ("layers.0",), "layers.1 bf16": ("layers.1",), "layers.2 bf16": ("layers.2",),
    "qkv_proj bf16": ("qkv_proj",), "o_proj bf16": ("o_proj",),
    "gate_up bf16": ("gate_up_proj",), "down_proj bf16": ("down_proj",),
}
orig = swap.quantize_model
for label, skip in SKIPS.items():
    swap.quantize_model = functools.partial(orig, skip=("lm_head", *skip))
    cfg = {**proposer_config("draft", 2, draft_model=DRAFT), "quantization": "int4"}
    llm = build_llm(None, {"speculative_config": cfg, "speculation_policy": "static",
                           "kv_cache_memory": "1GiB"})
    warm_up(llm.engine)
    out = run_workload(llm.engine, prepare_workload(llm.engine, workload, cap=32), 1, 8, False,
                       warm_shared_prefix=True)
    print(f"{label:16} {workload} acceptance {out['acceptance_rate']:.3f}", flush=True)
    del llm
