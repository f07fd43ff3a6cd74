"""`specserve bench offline`: throughput and latency of the engine in-process, per concurrency.

Each concurrency level runs one wave of `concurrency` requests submitted together, each with
`input_len` prompt tokens (real text from the prose workload, cut to length) and exactly
`output_len` generated tokens (EOS ignored), as vLLM's offline throughput benchmark does.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specserve.bench.workloads import load_workload
from specserve.llm import LLM
from specserve.sampling_params import SamplingParams


@dataclass
class BenchResult:
    system: str
    concurrency: int
    output_tok_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    wall_s: float

    def as_dict(self) -> dict:
        return asdict(self)


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def make_prompts(tokenizer, num: int, input_len: int) -> list[list[int]]:
    """num distinct prompts of exactly input_len tokens, from the prose workload's text: prompt
    i starts at text i. Past the last text, prompt i + k x len(texts) is prompt i's text shifted
    by k tokens: a repeat would find its blocks in the prefix cache (filled by an earlier chunk
    of the same wave) and skip its prefill, which HF generate never skips."""
    texts = [m["content"] for item in load_workload("prose") for m in item.messages]
    prompts = []
    for i in range(num):
        shift = i // len(texts)
        ids: list[int] = []
        j = i
        while len(ids) < input_len + shift:
            ids += tokenizer(texts[j % len(texts)] + "\n", add_special_tokens=False).input_ids
            j += 7
        prompts.append(ids[shift:shift + input_len])
    return prompts


def bench_engine(llm: LLM, prompts: list[list[int]], output_len: int) -> BenchResult:
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t0
    ttft = [o.metrics.ttft * 1e3 for o in outs]
    # Over the tokens each request generated, not output_len: one cut short by max_model_len
    # would read as fast as its missing tokens. A one-token reply has no interval to time.
    tpot = [(o.metrics.finished_time - o.metrics.first_token_time) * 1e3
            / (len(o.outputs[0].token_ids) - 1) for o in outs if len(o.outputs[0].token_ids) > 1]
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    return BenchResult("specserve", len(prompts), n_out / wall, percentile(ttft, 50),
                       percentile(ttft, 99), percentile(tpot, 50), percentile(tpot, 99), wall)


def bench_hf(model, prompts: list[list[int]], output_len: int) -> BenchResult:
    """Hugging Face `generate` with static batching (all prompts have the same length, so no
    padding is involved). TTFT is the time of a 1-token generate on the same batch. The inputs
    go to the model's device: on another device than the engine's the rows would not compare."""
    ids = torch.tensor(prompts, device=model.device)
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        ttft = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=output_len, min_new_tokens=output_len, **kw)
        wall = time.perf_counter() - t0
    n_out = (out.shape[1] - ids.shape[1]) * ids.shape[0]
    tpot = (wall - ttft) * 1e3 / max(output_len - 1, 1)
    return BenchResult("hf-generate", len(prompts), n_out / wall, ttft * 1e3, ttft * 1e3, tpot,
                       tpot, wall)


def load_hf_gguf_model(dtype: torch.dtype = torch.float32):
    """transformers' own GGUF loader (needs `accelerate`): an independent reading of the
    embedded file (dequantization, Q/K permutation), the anchor of the correctness tests.
    transformers' conversion takes ~28 s on a 2-core Zen 3, so its result is saved (fp32, with
    transformers' own save_pretrained) and later loads read that copy: still transformers'
    reading of the file, keyed by the file and the transformers version."""
    import hashlib
    import json
    import os

    import transformers
    from transformers import AutoModelForCausalLM

    from specserve.models.loader import _cache_dir, embedded_model_path

    path = embedded_model_path()
    stat = os.stat(path)
    key = f"{path}:{stat.st_size}:{stat.st_mtime_ns}:{transformers.__version__}"
    cached = _cache_dir() / "hf-from-gguf" / hashlib.sha1(key.encode()).hexdigest()[:16]
    if (cached / "config.json").is_file():
        try:
            return AutoModelForCausalLM.from_pretrained(str(cached), dtype=dtype,
                                                        local_files_only=True)
        except (OSError, ValueError):
            pass  # a partial copy: convert again
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                                 gguf_file=os.path.basename(path),
                                                 dtype=torch.float32)
    # save_pretrained refuses GGUF-loaded models: write the weights and config ourselves.
    from safetensors.torch import save_model

    try:
        cached.mkdir(parents=True, exist_ok=True)
        save_model(model, str(cached / "model.safetensors"))  # the tied head is stored once
        config = model.config.to_dict()
        config.pop("quantization_config", None)  # the copy is plain fp32
        (cached / "config.json").write_text(json.dumps(config))
    except OSError:
        pass  # a read-only cache only costs the speed-up
    return model.to(dtype)


def load_hf_model(dtype: torch.dtype, model: str | None = None,
                  device: str | torch.device = "cpu"):
    """A dense Hugging Face model of the engine's own model, for the speed baseline, on the
    engine's device. A local HF directory loads through transformers. None (the embedded model)
    or a .gguf file goes through our loader's dequantized weights into transformers' own model
    class: recent transformers keep GGUF weights packed and compute in fp32, which is not the
    "HF bf16" baseline we compare against."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    from specserve.models.loader import load_model

    path = None if model is None else Path(model).expanduser()
    if path is not None and path.is_dir():
        hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)
        # The checkpoint's generation_config.json (Qwen2.5-Instruct's repetition_penalty 1.05)
        # applies even to a greedy generate: the peer decodes plain greedy, as the engine's
        # rows do, its ids kept.
        g = hf.generation_config
        hf.generation_config = GenerationConfig(bos_token_id=g.bos_token_id,
                                                eos_token_id=g.eos_token_id,
                                                pad_token_id=g.pad_token_id)
    else:
        hf = _hf_from_state_dict(load_model(model)).to(dtype)
    return hf.to(device).eval()


def _hf_from_state_dict(loaded):
    """transformers' Llama / Qwen2 / Qwen3 ForCausalLM holding a LoadedModel's weights
    (ours fuse q/k/v and gate/up: split back)."""
    import transformers

    c = loaded.config
    if c.architecture == "llama" and c.attention_bias:
        # LlamaConfig's attention_bias also puts a bias on o_proj, which we would leave random.
        raise ValueError(f"{loaded.path}: a llama model with q/k/v biases has no Hugging Face "
                         "equivalent for the baseline")
    # By name: transformers before 4.51 has no Qwen3 classes, and needs none for the others.
    kind = {"qwen2": "Qwen2", "qwen3": "Qwen3"}.get(c.architecture, "Llama")
    config_cls = getattr(transformers, f"{kind}Config")
    model_cls = getattr(transformers, f"{kind}ForCausalLM")
    hf = model_cls(config_cls(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim,
        max_position_embeddings=c.max_position, rope_theta=c.rope_theta,
        rms_norm_eps=c.rms_norm_eps, tie_word_embeddings=c.tie_word_embeddings))
    sd = loaded.state_dict
    hf_sd = {"model.embed_tokens.weight": sd["embed_tokens.weight"],
             "model.norm.weight": sd["norm.weight"]}
    if not c.tie_word_embeddings:
        hf_sd["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(c.num_layers):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        sizes = [c.q_size, c.kv_size, c.kv_size]
        for kind in ("weight", "bias") if c.attention_bias else ("weight",):
            q, k, v = sd[p + f"attn.qkv_proj.{kind}"].split(sizes)
            hf_sd.update({h + f"self_attn.q_proj.{kind}": q, h + f"self_attn.k_proj.{kind}": k,
                          h + f"self_attn.v_proj.{kind}": v})
        gate, up = sd[p + "mlp.gate_up_proj.weight"].chunk(2)
        hf_sd.update({
            h + "self_attn.o_proj.weight": sd[p + "attn.o_proj.weight"],
            h + "mlp.gate_proj.weight": gate, h + "mlp.up_proj.weight": up,
            h + "mlp.down_proj.weight": sd[p + "mlp.down_proj.weight"],
            h + "input_layernorm.weight": sd[p + "input_norm.weight"],
            h + "post_attention_layernorm.weight": sd[p + "post_attn_norm.weight"]})
        if c.qk_norm:
            hf_sd.update({h + "self_attn.q_norm.weight": sd[p + "attn.q_norm.weight"],
                          h + "self_attn.k_norm.weight": sd[p + "attn.k_norm.weight"]})
    hf.load_state_dict(hf_sd, strict=False)
    hf.tie_weights()
    return hf


def run_offline(llm: LLM, concurrencies: list[int], input_len: int, output_len: int,
                compare_hf: bool = False, model: str | None = None) -> list[BenchResult]:
    """model: what the engine was built from (its `model` argument), which the HF baseline
    loads too: the prompts are token ids of that model's tokenizer."""
    prompts = make_prompts(llm.get_tokenizer(), max(concurrencies), input_len)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    # Prefix caching would let later waves skip their prefills; measure cold prefills.
    results = []
    hf = load_hf_model(llm.engine.dtype, model, llm.engine.device) if compare_hf else None
    if hf is not None:
        # Untimed: the first generate pays one-time costs (lazy init, kernels for new shapes),
        # which would inflate the first TTFT probe and, through TPOT = (wall - ttft) / steps,
        # shrink that level's TPOT; the engine was warmed up above too.
        bench_hf(hf, prompts[:1], 2)
    for c in concurrencies:
        llm.engine.reset_prefix_cache()
        results.append(bench_engine(llm, prompts[:c], output_len))
        if hf is not None:
            results.append(bench_hf(hf, prompts[:c], output_len))
    return results


def format_table(results: list[BenchResult]) -> str:
    head = f"{'system':<12} {'conc':>5} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} " \
           f"{'TPOT p50':>9} {'TPOT p99':>9}"
    rows = [head, "-" * len(head)]
    for r in results:
        rows.append(f"{r.system:<12} {r.concurrency:>5} {r.output_tok_s:>10.1f} "
                    f"{r.ttft_p50_ms:>7.1f}ms {r.ttft_p99_ms:>7.1f}ms {r.tpot_p50_ms:>7.2f}ms "
                    f"{r.tpot_p99_ms:>7.2f}ms")
    return "\n".join(rows)
