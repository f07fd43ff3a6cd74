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


@pytest.mark.parametrize("rows", [1, 2, 5, 32, 33, 64])
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


def _small_row_kernel_or_skip():
    from specserve.layers import paged_attention_ext as ext

    m = ext.module()
    if m is None or not m.bf16_linear_vectorized():
        pytest.skip("small-row bf16 kernel not built with AVX2 + FMA here")
    return m


# K 29: one 16-wide pair block + a scalar tail; K 70: four blocks + a tail; K 4,100: a grain of 16
# weight rows, so 37 of them split between threads at odd offsets. 37 weight rows: the 8 / 4 /
# 2-row blocks, the 2-row pairs past 3 activation rows, and an odd row left over.
@pytest.mark.parametrize("k", [29, 70, 4100])
def test_small_row_kernel_matches_float64_and_takes_fp32_activations(k):
    m = _small_row_kernel_or_skip()
    torch.manual_seed(1)
    w = torch.randn(37, k).bfloat16()
    for rows in range(1, m.bf16_linear_max_rows() + 1):
        x = torch.randn(rows, k)
        ref = x.bfloat16().double() @ w.double().T
        got = m.bf16_linear(x.bfloat16(), w, torch.empty(0))
        torch.testing.assert_close(got.double(), ref, rtol=2**-8, atol=1e-6)
        got32 = m.bf16_linear(x, w, torch.empty(0))  # fp32 activations, fp32 output
        assert got32.dtype == torch.float32
        # Any fp32 sum of k products is within k * 2^-24 * sum |x w| of the exact one.
        bound = k * 2**-24 * (x.double().abs() @ w.double().abs().T)
        assert ((got32.double() - x.double() @ w.double().T).abs() <= bound).all()


@pytest.mark.parametrize("k", [70, 4100])
def test_small_row_kernel_gives_a_row_the_same_bits_in_any_batch(k):
    """Every row count sums in one order, so up to the kernel's limit a request's logits do not
    depend on what else the step computes: decoding alone, verifying drafts (K + 1 rows), or in
    a batch of 32."""
    m = _small_row_kernel_or_skip()
    torch.manual_seed(2)
    w = torch.randn(37, k).bfloat16()
    bias = torch.randn(37).bfloat16()
    rows = m.bf16_linear_max_rows()
    x = torch.randn(rows, k) * 4  # fp32 activations: the sums' last bits reach the output
    alone = torch.cat([m.bf16_linear(x[i:i + 1], w, bias) for i in range(rows)])
    for n in range(2, rows + 1):
        assert torch.equal(m.bf16_linear(x[:n], w, bias), alone[:n]), n


def _amx_or_skip() -> int:
    rows = linear.amx_rows()
    if not rows:
        pytest.skip("no AMX tiles here (or SPECSERVE_NO_AMX is set)")
    return rows


# Output blocks of 16: 3 and 17 run one at a time (64 rows a pass), 4 and 32 in pairs (32 rows a
# pass); 17 and 32 split across threads.
@pytest.mark.parametrize("n", [48, 64, 272, 512])
def test_amx_kernel_matches_float64_at_every_row_count(n):
    """bf16 products summed in fp32 and rounded once: equal to the float64 result to bf16
    rounding, with and without a bias, for the row counts of each tile path (one 16-row block;
    32-row pairs with padding; several passes) and none."""
    max_rows = _amx_or_skip()
    m = linear.paged_attention_ext.module()
    torch.manual_seed(2)
    w = torch.randn(n, 96).bfloat16()  # K = 3 tiles of 32: an odd count for the 16-row path
    packed = linear.amx_pack_weight(w)
    for bias in (torch.empty(0), torch.randn(n).bfloat16(), torch.randn(n)):
        for rows in (0, 1, 5, 16, 17, 31, 32, 33, 48, 64, 65, 80, 97, 129, max_rows):
            x = torch.randn(rows, 96).bfloat16()
            got = m.amx_linear(x, packed, bias)
            ref = x.double() @ w.double().T + (bias.double() if bias.numel() else 0)
            assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
            torch.testing.assert_close(got.double(), ref, rtol=2**-8, atol=1e-5)
    with pytest.raises(RuntimeError, match="at most"):
        m.amx_linear(torch.zeros(max_rows + 1, 96).bfloat16(), packed, torch.empty(0))
    with pytest.raises(RuntimeError, match="packed by amx_pack_weight"):
        m.amx_linear(torch.zeros(2, 64).bfloat16(), packed, torch.empty(0))


def test_a_packed_bf16_layer_runs_amx_for_decode_rows_and_onednn_beyond(monkeypatch):
    max_rows = _amx_or_skip()
    torch.manual_seed(3)
    lin = nn.Linear(64, 80, bias=True).to(torch.bfloat16)
    packed = linear.PackedLinear(lin.weight, lin.bias, amx=True)
    assert packed.amx_rows == max_rows and packed.weight_nbytes == 2 * lin.weight.nbytes
    assert linear.PackedLinear(lin.weight, lin.bias).amx_rows == 0  # only when asked for
    calls = []
    ext = linear.paged_attention_ext.module()
    monkeypatch.setattr(linear.paged_attention_ext, "module", lambda: type(
        "Spy", (), {"amx_linear": lambda *a: calls.append(a[0].shape[0]) or ext.amx_linear(*a)}))
    for rows in (0, 1, max_rows, max_rows + 1):
        x = torch.randn(rows, 64, dtype=torch.bfloat16)
        ref = x.double() @ lin.weight.double().T + lin.bias.double()
        torch.testing.assert_close(packed(x).double(), ref, rtol=2**-8, atol=1e-5)
    assert calls == [1, max_rows]  # the empty and the prefill-sized calls went to oneDNN
    # 60 inputs are not whole tiles of 32: such a layer stays with oneDNN alone.
    assert linear.PackedLinear(lin.weight[:, :60].contiguous(), None, amx=True).amx_rows == 0


def test_pack_linears_counts_the_amx_copy_and_the_switch_turns_it_off(monkeypatch):
    _amx_or_skip()
    model = nn.Sequential(nn.Linear(32, 48, bias=False)).to(torch.bfloat16)
    assert linear.pack_linears(model) == model[0].weight_amx.nbytes == 32 * 48 * 2
    monkeypatch.setenv("SPECSERVE_NO_AMX", "1")
    assert linear.amx_rows() == 0
    model = nn.Sequential(nn.Linear(32, 48, bias=False)).to(torch.bfloat16)
    assert linear.pack_linears(model) == 0 and model[0].amx_rows == 0
