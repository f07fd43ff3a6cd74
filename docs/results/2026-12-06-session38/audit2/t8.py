import json, torch, time, traceback
from pathlib import Path
from specserve import LLM, SamplingParams
from specserve.bench.offline import load_hf_gguf_model
from safetensors.torch import save_file
out = Path("/tmp/audit2/smol")
if not (out/"config.json").exists():
    hf = load_hf_gguf_model(torch.float32).eval()
    out.mkdir(exist_ok=True)
    state = {k: v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(out / "model.safetensors"))
    cfg = hf.config.to_dict(); cfg.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(cfg))
    LLM_tok = None
base = json.load(open("/tmp/audit2/t3_base_noprefix_chunked_seqs1.json"))["base"]
doc = "Alice went to the market. She bought apples, oranges and pears. " * 20
prompts = ["The capital of France is",
           "def fibonacci(n):\n    if n <= 1:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\ndef factorial(n):",
           doc + "\nQuestion: what did Alice buy? Answer:",
           doc + "\nSummarize the text above in one sentence:",
           '{"name": "Bob", "age": 31, "city": "Paris"}\n{"name": "Eve", "age": 27, "city":']
# tokenizer: from the embedded engine's tokenizer
from specserve.models.loader import load_model
try:
    m = load_model(None); m.tokenizer.save_pretrained(out)
except Exception as e: print("tok save", e)
for kw in [dict(dtype="float32")]:
    llm = LLM(str(out), kv_cache_memory="128MiB", **kw)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    print(kw, [o.outputs[0].token_ids == b[:12] for o,b in zip(outs, base)], llm.engine.model_name)
    print(llm.chat([{"role":"user","content":"Say hi"}], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].text)
for p in ["/nonexistent/model", "/tmp/audit2", "/tmp/audit2/smol/config.json"]:
    try: LLM(p); print(p, "loaded?!")
    except Exception as e: print(p, type(e).__name__, str(e)[:300])
