"""Precision by hardware: bf16 where the CPU runs bf16 GEMMs natively, otherwise fp32 GEMMs on
the exact fp32 image of bf16 weights (specserve/hardware.py, layers/linear.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specserve.config import EngineConfig, parse_dtype
from specserve.hardware import cpu_can_pack_fp32, cpu_runs_bf16_well
from specserve.layers import linear

pytestmark = pytest.mark.skipif(not cpu_can_pack_fp32(), reason="oneDNN packing unavailable")


def test_auto_dtype_follows_the_hardware():
    assert parse_dtype("auto") == (torch.bfloat16 if cpu_runs_bf16_well() else torch.float32)
    assert parse_dtype("auto", "cpu") == EngineConfig().torch_dtype
    # The int8 / int4 kernels take bf16 activations on every CPU.
    assert EngineConfig(quantization="int4").torch_dtype == torch.bfloat16
    assert EngineConfig(dtype="float32", quantization="int4").torch_dtype == torch.float32
    with pytest.raises(ValueError, match="unknown dtype"):
        EngineConfig(dtype="bf17")


@pytest.mark.parametrize("rows", [1, 2, 5, 12, 13, 64])
def test_an_fp32_image_computes_what_a_bf16_gemm_computes(monkeypatch, rows):
    """bf16 inputs and weights are exact in fp32, so the emulated layer (the small-row kernel
    up to small_rows(), the fp32 image beyond) computes fp32 sums of the same products rounded
    once to bf16: equal to the float64 result to bf16 rounding."""
    monkeypatch.setattr(linear, "cpu_has_bf16_gemm", lambda: False)
    torch.manual_seed(0)
    lin = nn.Linear(100, 83, bias=True).to(torch.bfloat16)  # K and N tails for the kernel
    packed = linear.PackedLinear(lin.weight, lin.bias)
    assert packed.upcast
    # the fp32 image, plus the bf16 weight kept for the small-row kernel where it runs
    kept = lin.weight.nbytes if linear.small_rows() else 0
    assert packed.weight_nbytes == 2 * lin.weight.nbytes + kept
    x = torch.randn(rows, 100, dtype=torch.bfloat16)
    y = packed(x)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, 83)
    ref = x.double() @ lin.weight.double().T + lin.bias.double()
    torch.testing.assert_close(y.double(), ref, rtol=2**-8, atol=1e-6)


def test_pack_linears_counts_the_bytes_an_fp32_image_adds(monkeypatch):
    monkeypatch.setattr(linear, "cpu_has_bf16_gemm", lambda: False)
    model = nn.Sequential(nn.Linear(32, 48, bias=False), nn.Linear(48, 16)).to(torch.bfloat16)
    plain = sum(m.weight.nbytes for m in model)
    assert linear.pack_linears(model) == 2 * plain  # each image is twice its bf16 weight
    assert all(isinstance(m, linear.PackedLinear) and m.upcast for m in model)


def test_fp32_linears_are_packed_and_exact_to_fp32_rounding():
    torch.manual_seed(0)
    lin = nn.Linear(64, 40)
    packed = linear.PackedLinear(lin.weight, lin.bias)
    assert not packed.upcast
    x = torch.randn(7, 64)
    torch.testing.assert_close(packed(x), lin(x), rtol=1e-5, atol=1e-5)


def test_small_row_kernel_matches_float64_and_takes_fp32_activations():
    from specserve.layers import paged_attention_ext as ext

    m = ext.module()
    if m is None or not m.bf16_linear_vectorized():
        pytest.skip("small-row bf16 kernel not built with AVX2 + FMA here")
    torch.manual_seed(1)
    w = torch.randn(37, 29).bfloat16()  # 37 rows: 8-row blocks + tail; K 29: 8-wide + tail
    for rows in range(1, 8):
        x = torch.randn(rows, 29)
        ref = x.bfloat16().double() @ w.double().T
        got = m.bf16_linear(x.bfloat16(), w, torch.empty(0))
        torch.testing.assert_close(got.double(), ref, rtol=2**-8, atol=1e-6)
        got32 = m.bf16_linear(x, w, torch.empty(0))  # fp32 activations, fp32 output
        assert got32.dtype == torch.float32
        torch.testing.assert_close(got32.double(), x.double() @ w.double().T, rtol=1e-5,
                                   atol=1e-5)
