"""Loading a local Hugging Face directory (what a GPU user points the engine at): Llama and
Qwen2 (q/k/v bias), greedy output token-identical to transformers."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from tiny_models import make_tiny_model

from specserve import LLM, SamplingParams


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_hf_directory_matches_transformers(tmp_path, arch):
    from transformers import AutoModelForCausalLM

    path = make_tiny_model(tmp_path / arch, arch=arch, seed=3)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(str(path), dtype="float32", kv_cache_memory=8 << 20)
    prompts = [[5, 9, 13, 2, 40], [7] * 11, list(range(2, 30))]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    for prompt, out in zip(prompts, outs, strict=True):
        with torch.inference_mode():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=20, min_new_tokens=20,
                              do_sample=False, eos_token_id=None, pad_token_id=0)
        assert out.outputs[0].token_ids == ref[0, len(prompt):].tolist()


def test_embedded_model_saved_as_hf_directory_round_trips(tmp_path, llm, hf_model):
    """transformers' own export of the GGUF weights, read back through our safetensors path,
    gives the same greedy tokens as the GGUF path."""
    import json

    from safetensors.torch import save_file

    out = tmp_path / "smol"
    out.mkdir()
    # transformers refuses to re-serialise a GGUF-loaded model, so write the directory by hand.
    state = {k: v.contiguous() for k, v in hf_model.state_dict().items()
             if k != "lm_head.weight"}  # tied to the embedding
    save_file(state, str(out / "model.safetensors"))
    config = hf_model.config.to_dict()
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config))
    llm.get_tokenizer().save_pretrained(out)
    from_dir = LLM(str(tmp_path / "smol"), dtype="float32", kv_cache_memory=64 << 20)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompt = "The three primary colours are"
    assert from_dir.generate([prompt], params)[0].outputs[0].token_ids == \
        llm.generate([prompt], params)[0].outputs[0].token_ids


def test_building_an_engine_imports_neither_dynamo_nor_triton(tmp_path):
    """The model is built on the meta device without torch's reference ops (random init, the
    rotary table), whose first call imports torch._dynamo and triton: ~2 s of start-up, and
    triton's "leaked" messages at exit. A fresh process, as `specserve serve` starts."""
    path = make_tiny_model(tmp_path / "llama")
    code = ("import sys\nfrom specserve import LLM, SamplingParams\n"
            f"LLM({str(path)!r}).generate(['hi'], SamplingParams(max_tokens=2))\n"
            "print([m for m in ('torch._dynamo', 'triton') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "[]"
