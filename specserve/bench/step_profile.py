"""`specserve bench profile`: where a decode step's time goes.

Runs `concurrency` greedy requests into steady decode, then profiles a few steps with the torch
profiler and splits each step into matmul time (aten::mm / addmm / linear kernels, quantized
matmuls included), attention (bmm, softmax, gathers) and the rest (per-step overhead: Python,
scheduling, small ops, dispatch). The split is of the profiled steps' own wall time, so that its
parts add up (the profiler's per-op cost inflates those steps; step_ms is timed without it).
CPU only: the profiler records CPU activity, where a GPU op shows only its launch.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from torch.profiler import ProfilerActivity, profile, record_function

from specserve.bench.offline import make_prompts
from specserve.layers import paged_attention_ext
from specserve.llm import LLM
from specserve.sampling_params import SamplingParams

MATMUL_OPS = {"aten::mm", "aten::addmm", "mkldnn::_linear_pointwise", "specserve::bf16_linear",
              "specserve::amx_linear",
              "aten::_weight_int8pack_mm",
              "aten::_weight_int4pack_mm_for_cpu", "aten::_weight_int4pack_mm"}
ATTENTION_OPS = {"aten::bmm", "aten::_softmax", "aten::index_select", "aten::index_copy_",
                 "specserve::paged_attention_short"}


@contextmanager
def _visible_kernel():
    """The fused attention kernel is a pybind function, invisible to the torch profiler: label
    it while profiling (only then, so the hot path pays nothing)."""
    original = paged_attention_ext.paged_attention_short

    def labelled(*args, **kwargs):
        with record_function("specserve::paged_attention_short"):
            return original(*args, **kwargs)

    paged_attention_ext.paged_attention_short = labelled
    try:
        yield
    finally:
        paged_attention_ext.paged_attention_short = original


def profile_decode_step(llm: LLM, concurrency: int, context: int = 128,
                        num_steps: int = 8) -> dict:
    engine = llm.engine
    if engine.device.type != "cpu":
        raise ValueError(f"bench profile splits CPU time only; on {engine.device} the kernels' "
                         "time would land in 'other'")
    prompts = make_prompts(llm.get_tokenizer(), concurrency, context)
    params = SamplingParams(temperature=0, max_tokens=10_000, ignore_eos=True)
    ids = [engine.add_request(p, params).request_id for p in prompts]
    try:
        while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running) \
                or engine.scheduler.waiting:
            engine.step()
        for _ in range(3):
            engine.step()
        t0 = time.perf_counter()
        for _ in range(num_steps):
            engine.step()
        wall = (time.perf_counter() - t0) / num_steps
        with _visible_kernel(), profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            for _ in range(num_steps):
                engine.step()
            profiled = (time.perf_counter() - t0) / num_steps
        # self time, except for the labelled kernel, whose work is all inside its label
        ops = {e.key: (e.cpu_time_total if e.key.startswith("specserve::") else
                       e.self_cpu_time_total) / 1e3 / num_steps for e in prof.key_averages()}
    finally:
        for rid in ids:
            engine.abort_request(rid)
    matmul = sum(v for k, v in ops.items() if k in MATMUL_OPS)
    attention = sum(v for k, v in ops.items() if k in ATTENTION_OPS)
    top = sorted(ops.items(), key=lambda kv: -kv[1])[:8]
    return {"concurrency": concurrency, "step_ms": wall * 1e3,
            "profiled_step_ms": profiled * 1e3, "matmul_ms": matmul,
            "attention_ms": attention, "overhead_ms": profiled * 1e3 - matmul - attention,
            "top_ops_ms": {k: round(v, 3) for k, v in top}}


def format_profile(rows: list[dict]) -> str:
    lines = [f"{'conc':>5} {'step ms':>8} {'profiled':>8} {'matmul':>8} {'attention':>9} "
             f"{'other':>8}  top ops"]
    for r in rows:
        top = ", ".join(f"{k.replace('aten::', '')} {v:.2f}" for k, v in
                        list(r["top_ops_ms"].items())[:4])
        lines.append(f"{r['concurrency']:>5} {r['step_ms']:>8.2f} {r['profiled_step_ms']:>8.2f} "
                     f"{r['matmul_ms']:>8.2f} {r['attention_ms']:>9.2f} {r['overhead_ms']:>8.2f}"
                     f"  {top}")
    lines.append("matmul + attention + other = profiled (the profiled steps' own wall time, "
                 "inflated by the profiler); step ms: timed without the profiler")
    return "\n".join(lines)
