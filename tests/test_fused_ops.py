"""The fused CPU ops (RMSNorm, add + RMSNorm, RoPE + KV write, silu * up) against references
written the way transformers' Llama modules compute them, op by op."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specserve.layers import fused
from specserve.layers import paged_attention_ext as ext
from specserve.layers.kv_cache import LayerKVCache
from specserve.layers.rotary import RotaryEmbedding

pytestmark = pytest.mark.skipif(not ext.available(), reason="CPU extension unavailable")

DTYPES = (torch.bfloat16, torch.float32)
H, KVH, D = 9, 3, 64


def hf_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def hf_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb for one tensor [n, heads, D], cos/sin [n, 1, D]."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return (x * cos) + (torch.cat((-x2, x1), dim=-1) * sin)


def same(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16:  # bit-identical: the kernel rounds where transformers does
        assert torch.equal(a, b)
    else:  # fp32: only the sum of squares is reassociated
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 5, 300])  # 300 rows: split across threads
def test_rms_norm_and_fused_residual(dtype, n):
    g = torch.Generator().manual_seed(n)
    x = (3 * torch.randn(n, 576, generator=g)).to(dtype)
    res = torch.randn(n, 576, generator=g).to(dtype)
    w = (torch.rand(576, generator=g) + 0.5).to(dtype)
    same(fused.rms_norm(x, w, 1e-5), hf_rms_norm(x, w, 1e-5), dtype)

    want_res = res + x
    want = hf_rms_norm(want_res, w, 1e-5)
    got, got_res = fused.add_rms_norm(x.clone(), res.clone(), w, 1e-5)
    assert torch.equal(got_res, want_res)  # the residual add rounds exactly like `res + x`
    same(got, want, dtype)


@pytest.mark.parametrize("width", [600, 24])
def test_rms_norm_rows_with_a_tail(width):
    """bf16 rows run 32 lanes at a time and the rest in scalar code. The sum of squares is
    reassociated, so a rounding to bf16 may land one ulp away from transformers' on a rare
    element (at 576 wide these seeds happen to give none); a wrong tail would be far off."""
    g = torch.Generator().manual_seed(width)
    x = (3 * torch.randn(300, width, generator=g)).to(torch.bfloat16)
    res = torch.randn(300, width, generator=g).to(torch.bfloat16)
    w = (torch.rand(width, generator=g) + 0.5).to(torch.bfloat16)
    want_res = res + x
    fused_out, got_res = fused.add_rms_norm(x.clone(), res.clone(), w, 1e-5)
    assert torch.equal(got_res, want_res)
    for got, want in ((fused_out, hf_rms_norm(want_res, w, 1e-5)),
                      (fused.rms_norm(x, w, 1e-5), hf_rms_norm(x, w, 1e-5))):
        torch.testing.assert_close(got, want, rtol=2**-7, atol=0)  # one bf16 ulp
        assert (got != want).float().mean() < 1e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 200])
def test_rope_write_kv(dtype, n):
    g = torch.Generator().manual_seed(n)
    qkv = torch.randn(n, (H + 2 * KVH) * D, generator=g).to(dtype)
    positions = torch.randint(0, 4000, (n,), generator=g)
    cos, sin = RotaryEmbedding(D, 4096, 10000.0, dtype).lookup(positions)
    cache = LayerKVCache(512, KVH, D, dtype, dtype)
    slots = torch.randperm(512, generator=g)[:n]
    q = fused.rope_write_kv(qkv, cos, sin, slots, cache, H)

    heads = qkv.view(n, H + 2 * KVH, D)
    c, s = cos[:, None], sin[:, None]
    assert torch.equal(q, hf_rope(heads[:, :H], c, s))
    assert torch.equal(cache.k[slots], hf_rope(heads[:, H:H + KVH], c, s))
    assert torch.equal(cache.v[slots], heads[:, H + KVH:])
    untouched = torch.ones(512, dtype=torch.bool)
    untouched[slots] = False
    assert not cache.k[untouched].any() and not cache.v[untouched].any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn])
def test_rope_write_kv_into_8bit_pools(dtype, kv_dtype):
    """The kernel quantizes k and v exactly as LayerKVCache.write does (same scales, same
    values), after the same rotation."""
    n = 40
    g = torch.Generator().manual_seed(3)
    qkv = (4 * torch.randn(n, (H + 2 * KVH) * D, generator=g)).to(dtype)
    qkv[0, -D:] = 0  # an all-zero head: the scale's floor
    cos, sin = RotaryEmbedding(D, 256, 10000.0, dtype).lookup(torch.arange(n) * 3)
    slots = torch.randperm(128, generator=g)[:n]
    fast, ref = (LayerKVCache(128, KVH, D, kv_dtype, dtype) for _ in range(2))
    q = fused.rope_write_kv(qkv, cos, sin, slots, fast, H)
    assert torch.equal(q, fused.rope_write_kv_ref(qkv, cos, sin, slots, ref, H))
    for a, b in ((fast.k, ref.k), (fast.v, ref.v), (fast.k_scale, ref.k_scale),
                 (fast.v_scale, ref.v_scale)):
        assert torch.equal(a, b)
    assert fast.k.any() and fast.v_scale.any()
    # A head holding a NaN (activations that overflowed) gets a NaN scale from both writers,
    # not a finite one that would hide it; the other heads are as before.
    qkv[1, -D // 2] = float("nan")
    fast, ref = (LayerKVCache(128, KVH, D, kv_dtype, dtype) for _ in range(2))
    fused.rope_write_kv(qkv, cos, sin, slots, fast, H)
    fused.rope_write_kv_ref(qkv, cos, sin, slots, ref, H)
    nan = ref.v_scale.isnan()
    assert nan.sum() == 1 and torch.equal(fast.v_scale.isnan(), nan)
    assert torch.equal(fast.v_scale[~nan], ref.v_scale[~nan])
    assert torch.equal(fast.k, ref.k) and torch.equal(fast.k_scale, ref.k_scale)


def test_rope_write_kv_refuses_a_slot_outside_the_cache():
    qkv = torch.randn(1, (H + 2 * KVH) * D)
    cos, sin = RotaryEmbedding(D, 64, 10000.0, torch.float32).lookup(torch.tensor([0]))
    cache = LayerKVCache(16, KVH, D, torch.float32, torch.float32)
    with pytest.raises(RuntimeError, match="slot out of range"):
        fused.rope_write_kv(qkv, cos, sin, torch.tensor([16]), cache, H)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1536, 4864, 100, 37])
@pytest.mark.parametrize("scale", [1.0, 20.0, 90.0])
def test_silu_and_mul(dtype, width, scale):
    """Bit-identical to transformers' F.silu(gate) * up, also where exp over- or underflows,
    on denormals, zeros and infinities, and for widths that leave aten's vectorised loop a
    scalar tail (the fused bf16 kernel must round exactly where aten does)."""
    x = (torch.randn(33, 2 * width) * scale).to(dtype)
    x[0, :9] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), -87.5, -88.3, 1e-40,
                             -1e-39, 88.0]).to(dtype)
    gate, up = x.chunk(2, dim=-1)
    ref, got = F.silu(gate) * up, fused.silu_and_mul(x)
    assert torch.equal(ref.isnan(), got.isnan())
    assert torch.equal(ref.nan_to_num(), got.nan_to_num())


@pytest.mark.parametrize("width", [1024, 63])
def test_silu_and_mul_every_bf16_gate(width):
    """Every one of the 65,536 bf16 values as a gate, once where aten's silu runs its vector
    loop (rows of 1024) and once where it runs scalar code (rows of 63 < 64)."""
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    rows = -(-every.numel() // width)
    gate = torch.cat([every, every[: rows * width - every.numel()]]).view(rows, width)
    up = torch.rand(rows, width).to(torch.bfloat16) + 0.5
    ref, got = F.silu(gate) * up, fused.silu_and_mul(torch.cat([gate, up], dim=1))
    assert torch.equal(ref.isnan(), got.isnan())
    assert torch.equal(ref.nan_to_num(), got.nan_to_num())


def test_silu_and_mul_of_a_strided_view():
    """Rows further apart than 2I (a view into a wider tensor)."""
    wide = torch.randn(16, 4000).to(torch.bfloat16)
    x = wide[:, :3072]
    gate, up = x.chunk(2, dim=-1)
    assert torch.equal(fused.silu_and_mul(x), F.silu(gate) * up)


def test_autograd_takes_the_reference_path():
    """Training runs the same modules with gradients; the kernels have no backward."""
    x = torch.randn(4, 576, requires_grad=True)
    w = torch.ones(576, requires_grad=True)
    fused.rms_norm(x, w, 1e-5).sum().backward()
    assert x.grad is not None and w.grad is not None
