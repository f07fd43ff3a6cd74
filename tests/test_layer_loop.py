"""The C++ layer loop against LlamaModel.forward: the same ops in the same order, so a
decode-shaped step gives bit-identical hidden states and KV pools in every mode it accepts."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny_model

from specserve import LLM, SamplingParams
from specserve.engine import model_runner
from specserve.engine.request import Request
from specserve.layers import paged_attention_ext as ext
from specserve.models.layer_loop import LayerLoop

pytestmark = pytest.mark.skipif(not ext.available(), reason="CPU extension unavailable")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(make_tiny_model(tmp_path_factory.mktemp("loop") / "llama", num_layers=3))


def _step_both_ways(llm: LLM, aux_layers: tuple[int, ...] = ()):
    """Prefill three requests partly (Python path), then one decode-shaped step (1, 3 and 1
    query tokens: decodes and a verification-sized run) through the model and through the
    loop, from the same pool contents."""
    eng = llm.engine
    runner = eng.runner
    reqs = [Request(f"r{i}", [(7 * i + j) % 60 + 2 for j in range(20 + 9 * i)],
                    SamplingParams(max_tokens=1)) for i in range(3)]
    query = [1, 3, 1]
    for r, n in zip(reqs, query, strict=True):
        assert eng.block_manager.allocate(r, r.num_prompt_tokens)
        runner.execute(runner.prepare([(r, r.num_prompt_tokens - n)]), torch.tensor([0]))
        r.num_computed_tokens = r.num_prompt_tokens - n
    inputs = runner.prepare(list(zip(reqs, query, strict=True)))
    assert LayerLoop.accepts(inputs.meta)
    pools = [(c.k.clone(), c.v.clone()) for c in runner.kv_caches]
    aux = {"aux_layers": aux_layers} if aux_layers else {}
    want = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta, **aux)
    want_pools = [(c.k.clone(), c.v.clone()) for c in runner.kv_caches]
    for c, (k, v) in zip(runner.kv_caches, pools, strict=True):
        c.k.copy_(k)
        c.v.copy_(v)
    got = runner.layer_loop.forward(inputs.input_ids, inputs.positions, inputs.meta, **aux)
    return want, got, want_pools, [(c.k, c.v) for c in runner.kv_caches]


def _assert_step_is_exact(llm: LLM) -> torch.Tensor:
    """The engine runs the loop, and its step gives the model's hidden states and KV pools bit
    for bit (_step_both_ways); returns the loop's hidden states."""
    assert llm.engine.runner.layer_loop is not None
    want, got, want_pools, got_pools = _step_both_ways(llm)
    assert torch.equal(got, want)
    for (wk, wv), (gk, gv) in zip(want_pools, got_pools, strict=True):
        assert torch.equal(gk, wk) and torch.equal(gv, wv)
    return got


@pytest.mark.parametrize("kwargs", [
    {"dtype": "float32"},                         # oneDNN-packed fp32
    {"dtype": "bfloat16"},                        # packed bf16 (or its fp32 image, see below)
    {"dtype": "bfloat16", "quantization": "int4"},
    {"dtype": "bfloat16", "quantization": "int8"},
    {"dtype": "bfloat16", "kv_cache_dtype": "int8"},
    {"dtype": "float32", "kv_cache_dtype": "fp8_e4m3"},
])
def test_loop_matches_the_model_bit_for_bit(tiny, kwargs):
    llm = LLM(tiny, kv_cache_memory=8 << 20, **kwargs)
    _assert_step_is_exact(llm)


@pytest.mark.parametrize("kwargs", [{"dtype": "float32"}, {"dtype": "bfloat16"},
                                    {"dtype": "bfloat16", "quantization": "int4"}])
def test_loop_runs_qwen3s_q_k_norms_bit_for_bit(tmp_path, kwargs):
    """Qwen3: the per-head q/k norms run in the loop as Attention.norm_qk runs them."""
    qwen3 = str(make_tiny_model(tmp_path / "qwen3", arch="qwen3", num_layers=3, seed=2))
    llm = LLM(qwen3, kv_cache_memory=8 << 20, **kwargs)
    _assert_step_is_exact(llm)


def test_loop_runs_int4_twins_as_the_module_does(tiny, monkeypatch):
    """An int4 linear with a bf16 twin (what an int4 draft builds) runs the twin past
    INT4_KERNEL_MAX_ROWS rows, in the loop exactly as in Python; the step has 5 rows."""
    import functools

    from specserve.engine import llm_engine
    from specserve.hardware import cpu_has_bf16_gemm
    from specserve.quant.int4 import INT4_KERNEL_MAX_ROWS, Int4Linear
    from specserve.quant.swap import apply_quantization

    if not cpu_has_bf16_gemm():
        pytest.skip("twins are built only where bf16 GEMMs are native")
    monkeypatch.setattr(llm_engine, "apply_quantization",
                        functools.partial(apply_quantization, draft=True))
    llm = LLM(tiny, kv_cache_memory=8 << 20, dtype="bfloat16", quantization="int4")
    qkv = llm.engine.model.layers[0].attn.qkv_proj
    assert isinstance(qkv, Int4Linear) and qkv.twin is not None and INT4_KERNEL_MAX_ROWS < 5
    _assert_step_is_exact(llm)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_loop_returns_the_streams_an_eagle_head_fuses(tiny, dtype):
    """The residual streams after the asked layers (a fused-feature head's inputs), exactly as
    the Python path computes them."""
    llm = LLM(tiny, kv_cache_memory=8 << 20, dtype=dtype)
    (want, want_aux), (got, got_aux), _, _ = _step_both_ways(llm, aux_layers=(0, 1))
    assert torch.equal(got, want) and len(got_aux) == len(want_aux) == 2
    assert all(torch.equal(g, w) for g, w in zip(got_aux, want_aux, strict=True))
    assert not torch.equal(got_aux[0], got_aux[1])


def test_loop_runs_bf16_as_fp32_images_where_bf16_gemms_are_not_native(tiny, monkeypatch):
    """A CPU without bf16 GEMMs (forced here) holds each bf16 linear as the fp32 image of its
    weight: the loop runs that kind exactly as the module does."""
    from specserve.layers import linear

    monkeypatch.setattr(linear, "cpu_has_bf16_gemm", lambda: False)
    llm = LLM(tiny, kv_cache_memory=8 << 20, dtype="bfloat16")
    qkv = llm.engine.model.layers[0].attn.qkv_proj
    assert isinstance(qkv, linear.PackedLinear) and qkv.upcast
    assert _assert_step_is_exact(llm).dtype == torch.bfloat16


def test_loop_declines_what_it_cannot_run_exactly(tiny, tmp_path, monkeypatch):
    # Qwen2's qkv bias on an int4 linear is applied by the module in Python.
    qwen = str(make_tiny_model(tmp_path / "qwen", arch="qwen2"))
    assert LLM(qwen, kv_cache_memory=8 << 20, quantization="int4").engine.runner.layer_loop \
        is None
    assert LLM(qwen, kv_cache_memory=8 << 20).engine.runner.layer_loop is not None  # packed+bias
    # A 38-token prefill chunk runs in the loop (the kernel takes queries up to
    # KERNEL_QUERY_LEN); a chunk longer than that takes the gather path, outside it.
    llm = LLM(tiny, kv_cache_memory=8 << 20)
    r = Request("p", list(range(2, 40)), SamplingParams(max_tokens=1))
    assert llm.engine.block_manager.allocate(r, 38)
    assert LayerLoop.accepts(llm.engine.runner.prepare([(r, 38)]).meta)
    monkeypatch.setattr(model_runner, "KERNEL_QUERY_LEN", 16)
    assert not LayerLoop.accepts(llm.engine.runner.prepare([(r, 38)]).meta)


def test_generation_through_the_loop_equals_the_python_path(tiny):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [[(3 * i + j) % 60 + 2 for j in range(5 + 4 * i)] for i in range(4)]
    fast = LLM(tiny, kv_cache_memory=8 << 20, dtype="float32")
    slow = LLM(tiny, kv_cache_memory=8 << 20, dtype="float32")
    slow.engine.runner.layer_loop = None
    a = [o.outputs[0].token_ids for o in fast.generate(prompts, params)]
    b = [o.outputs[0].token_ids for o in slow.generate(prompts, params)]
    assert a == b
