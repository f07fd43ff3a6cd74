"""`specserve quality`: what quantization costs in model quality.

Perplexity on a fixed English text every Python install has (the documentation topics in the
standard library's `pydoc_data` package), computed through the engine's own paged KV cache, so an
8-bit KV cache is measured too; plus greedy agreement with the reference engine, the first row
(in --dtype, which "auto" makes fp32 on CPUs without bf16 GEMMs; the row says which): the
position where the greedy outputs first diverge, over a prompt set.
"""

from __future__ import annotations

import math
import statistics

import torch

from specserve.bench.workloads import load_workload
from specserve.engine.llm_engine import LLMEngine
from specserve.engine.request import Request
from specserve.llm import LLM
from specserve.sampling_params import SamplingParams


def reference_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def perplexity(engine: LLMEngine, token_ids: list[int], window: int = 512) -> float:
    """exp(mean NLL) over consecutive windows (each scored from scratch, no overlap)."""
    nll, count = 0.0, 0
    for start in range(0, len(token_ids) - 1, window):
        chunk = token_ids[start:start + window]
        if len(chunk) < 2:
            break
        req = Request(f"ppl-{start}", chunk, SamplingParams(max_tokens=1))
        if not engine.block_manager.allocate(req, len(chunk)):
            raise RuntimeError("the KV pool cannot hold one perplexity window")
        try:
            inputs = engine.runner.prepare([(req, len(chunk))])
            _, logits = engine.runner.execute(inputs, torch.arange(len(chunk) - 1))
        finally:
            engine.block_manager.free(req)
        logprobs = logits.log_softmax(dim=-1)
        targets = torch.tensor(chunk[1:])
        nll -= float(logprobs.gather(1, targets.unsqueeze(1)).sum())
        count += len(chunk) - 1
    return math.exp(nll / count)


def first_divergence(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a),
                                                                                       len(b)))


def greedy_outputs(llm: LLM, num_prompts: int, max_tokens: int) -> list[list[int]]:
    items = load_workload("prose")[:num_prompts]
    prompts = [llm.engine.apply_chat_template(it.messages) for it in items]
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def run_quality(configs: list[dict], num_tokens: int = 8192, num_prompts: int = 16,
                max_tokens: int = 64, **engine_kwargs) -> list[dict]:
    """configs: engine kwargs per row, the first being the reference (in engine_kwargs'
    dtype, which each row records)."""
    rows, reference = [], None
    text_ids: list[int] | None = None
    for cfg in configs:
        llm = LLM(**engine_kwargs, **cfg)
        if text_ids is None:
            text_ids = llm.engine.tokenize(reference_text())[:num_tokens]
        ppl = perplexity(llm.engine, text_ids)
        outs = greedy_outputs(llm, num_prompts, max_tokens)
        if reference is None:
            reference = {"ppl": ppl, "outs": outs}
        div = [first_divergence(a, b) for a, b in zip(outs, reference["outs"], strict=True)]
        rows.append({
            "config": cfg, "dtype": str(llm.engine.dtype).split(".")[-1],
            "weight_mb": llm.engine.weight_bytes / 1e6,
            "kv_blocks": llm.engine.block_manager.num_blocks, "perplexity": ppl,
            "ppl_change_pct": 100 * (ppl / reference["ppl"] - 1),
            "first_divergence_mean": statistics.mean(div),
            "first_divergence_min": min(div), "num_tokens": len(text_ids),
        })
    return rows


def format_quality(rows: list[dict]) -> str:
    lines = [f"{'config':<40} {'weights MB':>10} {'KV blocks':>9} {'ppl':>8} {'Δppl %':>7} "
             f"{'diverge@ (mean/min)':>20}"]
    for r in rows:
        # The reference runs in --dtype ("auto" is fp32 on some CPUs): say which.
        name = (", ".join(f"{k}={v}" for k, v in r["config"].items())
                or f"{r.get('dtype', 'unknown dtype')} (reference)")
        lines.append(f"{name:<40} {r['weight_mb']:>10.1f} {r['kv_blocks']:>9} "
                     f"{r['perplexity']:>8.3f} {r['ppl_change_pct']:>+7.2f} "
                     f"{r['first_divergence_mean']:>12.1f}/{r['first_divergence_min']}")
    return "\n".join(lines)
