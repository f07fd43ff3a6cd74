"""Peak host memory (max RSS) of building an engine from a bf16 Hugging Face directory, in a
fresh process: `python load_memory.py make DIR` writes a random Llama of ~0.5B parameters in
bf16 (once); `python load_memory.py load DIR` builds LLM(DIR, dtype="bfloat16") and prints the
process's peak RSS next to the checkpoint's size. Run `load` from two checkouts to compare."""
import json
import resource
import sys
import time
from pathlib import Path

import torch


def make(path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=49152, hidden_size=1536, intermediate_size=4096,
                      num_hidden_layers=16, num_attention_heads=12, num_key_value_heads=4,
                      max_position_embeddings=2048, tie_word_embeddings=False,
                      torch_dtype="bfloat16")
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    for p in model.parameters():
        torch.nn.init.normal_(p, 0, 0.02)
    model.save_pretrained(path)
    from specserve.models.loader import _gguf_tokenizer, embedded_model_path

    _gguf_tokenizer(embedded_model_path()).save_pretrained(path)  # SmolLM2's, 49152 ids


def load(path: Path) -> None:
    from specserve import LLM

    t0 = time.perf_counter()
    llm = LLM(str(path), dtype="bfloat16", kv_cache_memory=64 << 20)
    secs = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ckpt = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    import specserve

    params = ckpt / 2  # bf16
    print(json.dumps({"specserve": specserve.__file__, "params": int(params),
                      "checkpoint_bytes": ckpt, "peak_rss_bytes": peak,
                      "peak_rss_per_param": round(peak / params, 2), "load_s": round(secs, 1),
                      "engine_weight_bytes": llm.engine.weight_bytes}))


if __name__ == "__main__":
    {"make": make, "load": load}[sys.argv[1]](Path(sys.argv[2]))
