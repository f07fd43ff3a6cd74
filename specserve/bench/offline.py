"""`specserve bench offline`: throughput and latency of the engine in-process, per concurrency.

Each concurrency level runs one wave of `concurrency` requests submitted together, each with
`input_len` prompt tokens (real text from the prose workload, cut to length) and exactly
`output_len` generated tokens (EOS ignored), as vLLM's offline throughput benchmark does.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

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
    """num distinct prompts of exactly input_len tokens, from the prose workload's text."""
    texts = [m["content"] for item in load_workload("prose") for m in item.messages]
    prompts = []
    for i in range(num):
        ids: list[int] = []
        j = i
        while len(ids) < input_len:
            ids += tokenizer(texts[j % len(texts)] + "\n", add_special_tokens=False).input_ids
            j += 7
        prompts.append(ids[:input_len])
    return prompts


def bench_engine(llm: LLM, prompts: list[list[int]], output_len: int) -> BenchResult:
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t0
    ttft = [o.metrics.ttft * 1e3 for o in outs]
    tpot = [(o.metrics.finished_time - o.metrics.first_token_time) * 1e3 / max(output_len - 1, 1)
            for o in outs]
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    return BenchResult("specserve", len(prompts), n_out / wall, percentile(ttft, 50),
                       percentile(ttft, 99), percentile(tpot, 50), percentile(tpot, 99), wall)


def bench_hf(model, prompts: list[list[int]], output_len: int) -> BenchResult:
    """Hugging Face `generate` with static batching (all prompts have the same length, so no
    padding is involved). TTFT is the time of a 1-token generate on the same batch."""
    ids = torch.tensor(prompts)
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


def load_hf_model(dtype: torch.dtype, model: str | None = None):
    """A dense Hugging Face model for the speed baseline. Recent transformers keep GGUF weights
    packed and compute in fp32, which is not the "HF bf16" baseline we compare against, so the
    embedded model's dequantized weights go into transformers' own LlamaForCausalLM."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from specserve.models.loader import load_model

    if model is not None:
        return AutoModelForCausalLM.from_pretrained(model, dtype=dtype, local_files_only=True)
    loaded = load_model(None)
    c = loaded.config
    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads, max_position_embeddings=c.max_position,
        rope_theta=c.rope_theta, rms_norm_eps=c.rms_norm_eps, tie_word_embeddings=True))
    sd = loaded.state_dict
    hf_sd = {"model.embed_tokens.weight": sd["embed_tokens.weight"],
             "model.norm.weight": sd["norm.weight"]}
    for i in range(c.num_layers):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        q, k, v = sd[p + "attn.qkv_proj.weight"].split([c.q_size, c.kv_size, c.kv_size])
        gate, up = sd[p + "mlp.gate_up_proj.weight"].chunk(2)
        hf_sd.update({
            h + "self_attn.q_proj.weight": q, h + "self_attn.k_proj.weight": k,
            h + "self_attn.v_proj.weight": v,
            h + "self_attn.o_proj.weight": sd[p + "attn.o_proj.weight"],
            h + "mlp.gate_proj.weight": gate, h + "mlp.up_proj.weight": up,
            h + "mlp.down_proj.weight": sd[p + "mlp.down_proj.weight"],
            h + "input_layernorm.weight": sd[p + "input_norm.weight"],
            h + "post_attention_layernorm.weight": sd[p + "post_attn_norm.weight"]})
    hf.load_state_dict(hf_sd, strict=False)
    hf.tie_weights()
    return hf.to(dtype).eval()


def run_offline(llm: LLM, concurrencies: list[int], input_len: int, output_len: int,
                compare_hf: bool = False) -> list[BenchResult]:
    prompts = make_prompts(llm.get_tokenizer(), max(concurrencies), input_len)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    # Prefix caching would let later waves skip their prefills; measure cold prefills.
    results = []
    hf = load_hf_model(llm.engine.dtype) if compare_hf else None
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
