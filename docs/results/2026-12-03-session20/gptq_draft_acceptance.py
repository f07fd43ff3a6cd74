"""Round-to-nearest int4 against GPTQ int4 for the trained 3-layer draft: served greedy
acceptance at static K=2, c1, 8 requests per workload (the workloads' first 8 prompts).
Calibration: prompts 20-39 of each of the four workloads with the target's greedy reply
(64 tokens), run through the bf16 draft with a dense forward."""
import os
import sys

import torch

import specserve.quant.swap as swap
from specserve import LLM, SamplingParams
from specserve.bench.lab import build_llm, prepare_workload, proposer_config, run_workload, warm_up
from specserve.bench.workloads import load_workload
from specserve.quant.gptq import HessianCollector, gptq_int4
from specserve.quant.int4 import Int4Linear
from specserve.train.dense_forward import dense_hidden

DRAFT = os.path.expanduser("~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-3")
workloads = sys.argv[1].split(",") if len(sys.argv) > 1 else ["json", "prose"]
variants = sys.argv[2].split(",") if len(sys.argv) > 2 else ["none", "int4", "gptq"]

target = LLM()
prompts = [target.engine.apply_chat_template(i.messages)
           for w in ("prose", "json", "sql", "rag") for i in load_workload(w)[20:40]]
outs = target.generate(prompts, SamplingParams(temperature=0, max_tokens=64))
calib = [list(p) + list(o.outputs[0].token_ids) for p, o in zip(prompts, outs)]
print(f"calibration: {len(calib)} sequences, {sum(map(len, calib))} tokens", flush=True)
del target

orig = swap.quantize_model


def gptq_model(model, method, **kw):
    names = [n for n, m in model.named_modules()
             if type(m) is torch.nn.Linear and not n.endswith("lm_head")]
    col = HessianCollector(model, names)
    with torch.inference_mode():
        for ids in calib:
            dense_hidden(model, torch.tensor([ids]))
    col.remove()
    for n in names:
        lin = model.get_submodule(n)
        q, s, z = gptq_int4(lin.weight, col.hessians[n] / col.num_rows[n])
        parent, _, attr = n.rpartition(".")
        setattr(model.get_submodule(parent), attr, Int4Linear(q, s, z, 32, lin.bias))
    return model


for v in variants:
    cfg = proposer_config("draft", 2, draft_model=DRAFT)
    if v != "none":
        cfg["quantization"] = "int4"
    swap.quantize_model = gptq_model if v == "gptq" else orig
    llm = build_llm(None, {"speculative_config": cfg, "speculation_policy": "static",
                           "kv_cache_memory": "1GiB"})
    warm_up(llm.engine)
    for w in workloads:
        out = run_workload(llm.engine, prepare_workload(llm.engine, w, cap=32), 1, 8, False,
                           warm_shared_prefix=True)
        print(f"{v:6} {w:6} acceptance {out['acceptance_rate']:.3f}", flush=True)
    del llm
