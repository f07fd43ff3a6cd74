"""Loading a local Hugging Face directory (what a GPU user points the engine at): Llama,
Qwen2 (q/k/v bias) and Qwen3 (q/k norms, wide heads), greedy output token-identical to
transformers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from tiny_models import make_tiny_model

from specserve import LLM, SamplingParams


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
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


ROPES = {
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "linear": {"rope_type": "linear", "factor": 4.0},
}


@pytest.mark.parametrize("rope", list(ROPES))
def test_scaled_rope_matches_transformers(tmp_path, rope):
    """Llama 3.1's "llama3" rope, yarn (whose attention factor scales cos and sin) and linear
    scaling: the logits over a long prompt are transformers' (an unscaled rope was read
    silently before, and every position was wrong)."""
    from transformers import AutoModelForCausalLM

    path = make_tiny_model(tmp_path / rope, seed=4, rope_scaling=ROPES[rope])
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(str(path), dtype="float32", kv_cache_memory=8 << 20)
    assert dict(llm.engine.model_config.rope_scaling)["rope_type"] == rope
    prompt = [(7 * i) % 60 + 2 for i in range(120)]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1, logprobs=5,
                                                ignore_eos=True))[0].outputs[0]
    with torch.inference_mode():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, -1].float(), -1)
    top = ref.topk(5)
    assert out.token_ids[0] == top.indices[0].item()
    got = out.logprobs[0]
    for token, logprob in zip(top.indices.tolist(), top.values.tolist(), strict=True):
        assert got[token] == pytest.approx(logprob, abs=1e-3)


@pytest.mark.parametrize("original", [128, None])
def test_a_yarn_rope_extends_the_context_as_transformers_computes_it(tmp_path, original):
    """Qwen2.5's long-context edit: max_position_embeddings stays the original length and yarn's
    factor extends it. The context is original x factor (vLLM's reading), and logits past the
    original length are transformers' (without an original length in the config, transformers
    takes max_position_embeddings for it)."""
    from transformers import AutoModelForCausalLM

    yarn = {"rope_type": "yarn", "factor": 4.0} | (
        {"original_max_position_embeddings": original} if original else {})
    path = make_tiny_model(tmp_path / "yarn", seed=4, max_position_embeddings=128,
                           rope_scaling=yarn)
    llm = LLM(str(path), dtype="float32", kv_cache_memory=8 << 20)
    assert llm.engine.max_model_len == 512
    prompt = [(7 * i) % 60 + 2 for i in range(300)]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1, logprobs=3,
                                                ignore_eos=True))[0].outputs[0]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, -1].float(), -1)
    top = ref.topk(3)
    assert out.token_ids[0] == top.indices[0].item()
    for token, logprob in zip(top.indices.tolist(), top.values.tolist(), strict=True):
        assert out.logprobs[0][token] == pytest.approx(logprob, abs=1e-3)


def test_a_yarn_rope_is_refused_where_transformers_reads_it_otherwise(monkeypatch):
    # transformers 4.x computes yarn's frequencies from the extended context: wrong ones.
    import transformers

    from specserve.layers.rotary import scaled_inv_freq

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    scaled_inv_freq(16, 256, 10000.0, yarn)  # the installed 5.x
    monkeypatch.setattr(transformers, "__version__", "4.57.1")
    with pytest.raises(ValueError, match="transformers >= 5"):
        scaled_inv_freq(16, 256, 10000.0, yarn)


def test_checkpoints_whose_outputs_would_be_wrong_are_refused(tmp_path):
    """A tensor with no place in the model (o_proj's bias, which transformers' Llama has with
    attention_bias), a pre-quantized checkpoint, a rope whose frequencies change with the
    length and a directory without a tokenizer: each is a clear error, not a model that loads
    and answers wrongly."""
    import json

    biased = make_tiny_model(tmp_path / "bias", attention_bias=True)
    with pytest.raises(ValueError, match="o_proj.bias"):
        LLM(str(biased), dtype="float32", kv_cache_memory=8 << 20)
    quantized = make_tiny_model(tmp_path / "fp8")
    config = json.loads((quantized / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8"}
    (quantized / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="pre-quantized checkpoint .fp8."):
        LLM(str(quantized), dtype="float32", kv_cache_memory=8 << 20)
    dynamic = make_tiny_model(tmp_path / "dynamic",
                              rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(ValueError, match="rope .* is not supported"):
        LLM(str(dynamic), dtype="float32", kv_cache_memory=8 << 20)
    # Weights saved without their tokenizer: transformers would make a Qwen2 one of one token
    # (every prompt empty).
    bare = make_tiny_model(tmp_path / "bare", arch="qwen2")
    for f in bare.glob("tokenizer*"):
        f.unlink()
    with pytest.raises(ValueError, match="no tokenizer"):
        LLM(str(bare), dtype="float32", kv_cache_memory=8 << 20)


def test_shards_are_read_through_their_index_and_a_sliding_window_caps_the_context(tmp_path):
    """A sharded checkpoint loads through model.safetensors.index.json, and a consolidated
    copy beside the shards (Mistral's snapshots hold one) is not read as well. Mistral's
    sliding window, which attention here does not implement, caps the context at its length,
    and Qwen2's where some layer uses it."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    path = make_tiny_model(tmp_path / "mistral", max_shard_size="100KB")
    assert (path / "model.safetensors.index.json").is_file()
    whole = {}
    for f in sorted(path.glob("model-*.safetensors")):
        whole |= load_file(str(f))
    save_file(whole, str(path / "consolidated.safetensors"))
    config = json.loads((path / "config.json").read_text())
    config |= {"model_type": "mistral", "architectures": ["MistralForCausalLM"],
               "sliding_window": 64}
    (path / "config.json").write_text(json.dumps(config))
    llm = LLM(str(path), dtype="float32", kv_cache_memory=8 << 20)
    assert llm.engine.max_model_len == 64
    plain = tmp_path / "plain"
    shutil.copytree(path, plain)
    (plain / "consolidated.safetensors").unlink()
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    assert (llm.generate([[5, 9, 13]], params)[0].outputs[0].token_ids
            == LLM(str(plain), dtype="float32", kv_cache_memory=8 << 20)
            .generate([[5, 9, 13]], params)[0].outputs[0].token_ids)
    # Without an index too: one model.safetensors and a consolidated copy.
    single = make_tiny_model(tmp_path / "single")
    save_file({f"mistral_format.{k}": v  # its own tensor names, which have no place here
               for k, v in load_file(str(single / "model.safetensors")).items()},
              str(single / "consolidated.safetensors"))
    LLM(str(single), dtype="float32", kv_cache_memory=8 << 20)
    # Qwen2 windows its layers from max_window_layers on: the cap only where one is windowed.
    for layers_unwindowed, cap in ((2, 256), (1, 64)):
        qwen = make_tiny_model(tmp_path / f"qwen{layers_unwindowed}", arch="qwen2",
                               use_sliding_window=True, sliding_window=64,
                               max_window_layers=layers_unwindowed)
        assert LLM(str(qwen), dtype="float32", kv_cache_memory=8 << 20).engine.max_model_len \
            == cap


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


def test_generation_config_sets_the_default_sampling(tmp_path):
    """A model's generation_config.json sets what a request leaves unset (vLLM's
    `--generation-config auto`): here temperature 0, so a request that names no temperature is
    greedy, and max_new_tokens is its max_tokens; `vllm` ignores the file; a request's own
    value wins over the file."""
    import json

    path = make_tiny_model(tmp_path / "m", seed=5)
    cfg = json.loads((path / "generation_config.json").read_text())
    cfg |= {"temperature": 0.0, "top_p": 0.9, "top_k": 50, "min_p": 0.05,
            "repetition_penalty": 1.0, "max_new_tokens": 5}
    (path / "generation_config.json").write_text(json.dumps(cfg))
    llm = LLM(str(path), dtype="float32", kv_cache_memory=8 << 20)
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_p, defaults.top_k, defaults.min_p,
            defaults.repetition_penalty, defaults.max_tokens) == (0.0, 0.9, 50, 0.05, 1.0, 5)
    prompt = [[5, 9, 13, 2, 40]]
    greedy = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=24,
                                                 ignore_eos=True))[0].outputs[0].token_ids
    unset = llm.generate(prompt, None)[0].outputs[0].token_ids  # may stop at eos
    assert unset == greedy[:len(unset)] and 0 < len(unset) <= 5
    # The request's own temperature wins: seeded sampling at 1.0 leaves the greedy path.
    sampled = [llm.generate(prompt, SamplingParams(temperature=1.0, seed=s, max_tokens=24,
                                                   ignore_eos=True))[0].outputs[0].token_ids
               for s in range(4)]
    assert any(s != greedy for s in sampled)

    plain = LLM(str(path), dtype="float32", kv_cache_memory=8 << 20, generation_config="vllm")
    assert plain.get_default_sampling_params().temperature == 1.0
    assert plain.get_default_sampling_params().top_p == 1.0

    cfg["temperature"] = -1.0
    (path / "generation_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="temperature"):
        LLM(str(path), dtype="float32", kv_cache_memory=8 << 20)
    with pytest.raises(ValueError, match="generation_config must be"):
        LLM(str(path), dtype="float32", kv_cache_memory=8 << 20, generation_config="nowhere")


def test_a_bf16_checkpoint_is_read_as_is_and_the_tokenizers_eos_stops(tmp_path):
    """Weights keep the checkpoint's dtype until build_model converts each once (no fp32 copy
    of an 8B model on the host), and land bit-exact in a bf16 model; the tokenizer's EOS is a
    stop token even when config.json names another (a ChatML fine-tune's <|im_end|>)."""
    import json

    from safetensors.torch import load_file, save_file

    from specserve.models.llama import build_model
    from specserve.models.loader import load_model

    path = make_tiny_model(tmp_path / "m", seed=6, eos_token_id=5)
    weights = path / "model.safetensors"
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(weights).items()}, weights,
              metadata={"format": "pt"})
    gen = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps(gen | {"eos_token_id": 5}))
    loaded = load_model(str(path))
    assert {t.dtype for t in loaded.state_dict.values()} == {torch.bfloat16}
    assert set(loaded.config.eos_token_ids) == {5, 1}  # config's, and the tokenizer's <eos>
    model = build_model(loaded.config, loaded.state_dict, torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.equal(model.embed_tokens.weight, loaded.state_dict["embed_tokens.weight"])
    # Without ignore_eos a reply ends at the tokenizer's EOS if the model ever samples it.
    llm = LLM(str(path), dtype="float32", kv_cache_memory=8 << 20)
    params = SamplingParams(temperature=0, max_tokens=200, logit_bias={1: 100.0}, min_tokens=3)
    out = llm.generate([[5, 9, 13]], params)[0].outputs[0]
    assert out.finish_reason == "stop" and len(out.token_ids) == 4 and out.token_ids[-1] == 1


def test_chat_template_and_max_model_len_flags(tmp_path, caplog):
    """vLLM's --chat-template gives a base model (no template: a warning at start-up) one to
    chat with, as text or as a file; --max-model-len bounds the context below the model's."""
    path = make_tiny_model(tmp_path / "m", seed=7)
    with caplog.at_level("WARNING", logger="specserve"):
        bare = LLM(str(path), dtype="float32", kv_cache_memory=8 << 20)
    assert "has no chat template" in caplog.text
    with pytest.raises(ValueError):
        bare.chat([{"role": "user", "content": "w5 w6"}])
    template = "{% for m in messages %}{{ m['content'] }} {% endfor %}w9"
    (tmp_path / "t.jinja").write_text(template)
    for given in (template, str(tmp_path / "t.jinja")):
        llm = LLM(str(path), dtype="float32", kv_cache_memory=8 << 20, chat_template=given,
                  max_model_len=40)
        out = llm.chat([{"role": "user", "content": "w5 w6"}],
                       SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
        assert out.prompt_token_ids == [5, 6, 9] and len(out.outputs[0].token_ids) == 4
        assert llm.engine.max_model_len == 40
    with pytest.raises(ValueError, match="maximum context length is 40"):
        llm.generate([[5] * 40])
    with pytest.raises(ValueError, match="longer than the model's context"):
        LLM(str(path), dtype="float32", kv_cache_memory=8 << 20, max_model_len=10_000)
    with pytest.raises(ValueError, match="neither a file nor a Jinja"):
        LLM(str(path), dtype="float32", kv_cache_memory=8 << 20, chat_template="nope.jinja")


def test_qwen3_in_bf16_with_drafts_is_lossless(tmp_path):
    """Qwen3 in the serving dtype (its q/k norms in the C++ layer loop): a self-draft of its
    first layer (q/k norms too) and n-gram guesses leave greedy tokens as they are without
    speculation."""
    path = str(make_tiny_model(tmp_path / "qwen3", arch="qwen3", seed=7))
    prompts = [[5, 9, 13, 2, 40], [7, 8] * 6, list(range(2, 30))]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(path, kv_cache_memory=8 << 20)
    assert plain.engine.runner.layer_loop is not None
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    for spec in ({"method": "draft", "draft_layers": 1, "num_speculative_tokens": 3},
                 {"method": "ngram", "num_speculative_tokens": 3}):
        llm = LLM(path, kv_cache_memory=8 << 20, speculative_config=spec,
                  speculation_policy="static")
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == want
        assert llm.get_stats()["num_draft_tokens"] > 0


def _qwen3_as_gguf(hf_dir, out, experts: int = 0) -> str:
    """Write a Hugging Face Qwen3 directory as llama.cpp's converter lays it out (its tensor
    names, HF row order for q/k, the head width in attention.key_length), in F32, with a
    byte-level tokenizer of the model's 64 ids (the last one EOS, the one before it EOT);
    experts: an expert count in the metadata, as a mixture of experts has."""
    import gguf
    from safetensors.torch import load_file
    from tokenizers.pre_tokenizers import ByteLevel

    cfg = json.loads((hf_dir / "config.json").read_text())
    sd = load_file(str(hf_dir / "model.safetensors"))
    w = gguf.GGUFWriter(str(out), "qwen3")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(sorted(ByteLevel.alphabet())[:63] + ["<|im_end|>"])
    w.add_token_types([1] * 63 + [3])
    w.add_token_scores([0.0] * 64)
    w.add_token_merges([])
    w.add_eos_token_id(63)
    w.add_eot_token_id(62)
    if experts:
        w.add_expert_count(experts)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    names = {"model.embed_tokens": "token_embd", "model.norm": "output_norm",
             "lm_head": "output", "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, t in sd.items():
        base = name.removesuffix(".weight")
        if base.startswith("model.layers."):
            _, _, i, rest = base.split(".", 3)
            base = f"blk.{i}.{names[rest]}"
        else:
            base = names[base]
        w.add_tensor(base + ".weight", t.float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(out)


def test_a_qwen3_gguf_matches_transformers(tmp_path, monkeypatch):
    """A Qwen3 GGUF: q/k norms read, q/k rows left in order (only llama's are permuted), the
    head width from key_length (hidden / heads would be 16 here, not 32), and its end-of-turn
    token among the stops; a mixture of experts is refused by name."""
    from transformers import AutoModelForCausalLM

    from specserve.models import loader

    monkeypatch.setattr(loader, "_cache_dir", lambda: tmp_path / "cache")  # conversions
    hf_dir = make_tiny_model(tmp_path / "qwen3", arch="qwen3", seed=9)
    llm = LLM(_qwen3_as_gguf(hf_dir, tmp_path / "qwen3.gguf"), dtype="float32",
              kv_cache_memory=8 << 20)
    assert llm.engine.model_config.qk_norm and llm.engine.model_config.head_dim == 32
    assert llm.engine.model_config.eos_token_ids == (63, 62)  # llama.cpp stops at either
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    prompt = [5, 9, 13, 2, 40, 7]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    with torch.inference_mode():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=20, min_new_tokens=20,
                          do_sample=False, eos_token_id=None, pad_token_id=0)
    assert out[0].outputs[0].token_ids == ref[0, len(prompt):].tolist()
    with pytest.raises(ValueError, match="mixture-of-experts"):
        LLM(_qwen3_as_gguf(hf_dir, tmp_path / "moe.gguf", experts=8), dtype="float32",
            kv_cache_memory=8 << 20)
