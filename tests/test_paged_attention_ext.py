"""The fused CPU paged-attention kernel against a float64 reference written with torch ops."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from specserve.layers import paged_attention_ext as ext
from specserve.layers.kv_cache import quantize_kv

pytestmark = pytest.mark.skipif(not ext.available(), reason="paged attention extension unavailable")

# Error vs the float64 reference computed from the same (bf16-exact) inputs; outputs are O(1).
# fp32: |err| <= 1e-5 (measured max 6e-7 over 80 random cases: accumulation order, exp polynomial).
# bf16: the only large error is the final round-to-nearest of the output, at most half a bf16
# ulp, i.e. 2^-8 * |ref|; so |err| <= 2^-8 |ref| + 1e-5 (measured: never more than 2.5e-8 over
# that bound; max abs error 7.8e-3 at |ref| ~ 2).
TOL = {torch.float32: (1e-5, 0.0), torch.bfloat16: (1e-5, 2.0**-8)}


def make_case(ctx_lens, q_lens, num_heads, num_kv_heads, head_dim, dtype, block_size=16,
              seed=0):
    """Random paged cache with shuffled block tables. Sequence s has ctx_lens[s] keys in the
    cache and its last q_lens[s] positions are query tokens (spec-verify shape)."""
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-c // block_size) for c in ctx_lens]
    max_blocks = max(blocks_per_seq) + 1  # a spare column: entries past the context are junk
    num_blocks = sum(blocks_per_seq) + 7
    perm = torch.randperm(num_blocks, generator=g).to(torch.int32)
    # Entries past a sequence's context are junk (out of range): the kernel must not read them.
    tables = torch.full((len(ctx_lens), max_blocks), 10**6, dtype=torch.int32)
    used = 0
    for s, nb in enumerate(blocks_per_seq):
        tables[s, :nb] = perm[used:used + nb]
        used += nb
    shape = (num_blocks * block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=g).to(dtype)
    v_cache = torch.randn(shape, generator=g).to(dtype)
    seq, pos = [], []
    for s, (c, n) in enumerate(zip(ctx_lens, q_lens, strict=True)):
        seq += [s] * n
        pos += list(range(c - n, c))
    q = torch.randn(len(seq), num_heads, head_dim, generator=g).to(dtype)
    return (q, k_cache, v_cache, tables, torch.tensor(seq, dtype=torch.int32),
            torch.tensor(pos, dtype=torch.int32))


def reference(q, k_cache, v_cache, tables, token_seq, token_pos, block_size, scale):
    """Per sequence: gather the slots of its positions, repeat KV heads, causal softmax in fp64."""
    num_heads = q.shape[1]
    grp = num_heads // k_cache.shape[1]
    out = torch.empty(q.shape[0], num_heads * q.shape[2], dtype=torch.float64)
    for s in token_seq.unique().tolist():
        toks = (token_seq == s).nonzero().flatten()
        pos = token_pos[toks].long()  # [n]
        positions = torch.arange(int(pos.max()) + 1)
        slots = tables[s].long()[positions // block_size] * block_size + positions % block_size
        k = k_cache[slots].double().repeat_interleave(grp, dim=1)  # [c, H, D]
        v = v_cache[slots].double().repeat_interleave(grp, dim=1)
        scores = torch.einsum("nhd,chd->nhc", q[toks].double(), k) * scale
        causal = positions[None, :] <= pos[:, None]  # [n, c]
        scores = scores.masked_fill(~causal[:, None, :], float("-inf"))
        out[toks] = torch.einsum("nhc,chd->nhd", scores.softmax(-1), v).flatten(1)
    return out


def check(ctx_lens, q_lens, num_heads, num_kv_heads, head_dim, dtype, block_size=16, seed=0,
          **kw):
    q, kc, vc, bt, ts, tp = make_case(ctx_lens, q_lens, num_heads, num_kv_heads, head_dim, dtype,
                                      block_size, seed)
    scale = head_dim ** -0.5
    out = ext.paged_attention_short(q, kc, vc, bt, ts, tp, block_size, scale, **kw)
    assert out.shape == (q.shape[0], num_heads * head_dim) and out.dtype == dtype
    ref = reference(q, kc, vc, bt, ts, tp, block_size, scale)
    atol, rtol = TOL[dtype]
    err = (out.double() - ref).abs()
    excess = (err - atol - rtol * ref.abs()).max().item()
    assert excess <= 0, f"error exceeds atol={atol} + rtol={rtol} * |ref| by {excess:.3g}"
    return err.max().item()


CTX = [1, 2, 15, 16, 17, 31, 33, 64, 100, 255, 256, 257, 300]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(4, 4), (9, 3)])
def test_decode(dtype, head_dim, heads):
    check(CTX, [1] * len(CTX), *heads, head_dim, dtype, seed=head_dim + heads[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(4, 4), (9, 3)])
def test_spec_verify(dtype, head_dim, heads):
    ctx = [5, 16, 40, 129, 300, 77]
    q_lens = [5, 3, 16, 1, 7, 2]  # consecutive positions of the same sequence
    check(ctx, q_lens, *heads, head_dim, dtype, seed=1 + head_dim + heads[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(9, 3), (8, 2), (4, 4)])
def test_prefill(dtype, head_dim, heads):
    """Whole prompts, and prompt chunks over a cached prefix: runs of up to 16 tokens with 16 to
    64 rows per KV head. On AMX CPUs the bf16 runs of more than 16 rows per KV head take
    amx_rows_head (keys and values re-laid per tile, P in two bf16 parts), whose P V must stay
    within the same bound as the rest: P rounded once to bf16 would not."""
    ctx = [1, 17, 40, 130, 300, 64]
    q_lens = [1, 17, 40, 100, 45, 33]
    check(ctx, q_lens, *heads, head_dim, dtype, seed=head_dim + heads[0] + 20)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_nan_past_the_context_is_masked(dtype, head_dim, block_size):
    """The rest of a sequence's last block holds NaN. On AMX CPUs the bf16 kernel scores whole
    groups of 16 slots there and must mask those scores: a NaN mixed into a softmax or P.V would
    show in every output row of the sequence (prefill runs re-lay the slots they read and must
    not carry NaN over either)."""
    ctx, q_lens = [1, 15, 16, 17, 33, 47, 100, 70, 41], [1, 1, 1, 5, 1, 3, 1, 70, 30]
    q, kc, vc, bt, ts, tp = make_case(ctx, q_lens, 9, 3, head_dim, dtype, block_size, seed=5)
    for s, c in enumerate(ctx):
        for pos in range(c, -(-c // block_size) * block_size):
            slot = int(bt[s, pos // block_size]) * block_size + pos % block_size
            kc[slot] = float("nan")
            vc[slot] = float("nan")
    scale = head_dim ** -0.5
    out = ext.paged_attention_short(q, kc, vc, bt, ts, tp, block_size, scale)
    ref = reference(q, kc, vc, bt, ts, tp, block_size, scale)
    assert not ref.isnan().any()
    atol, rtol = TOL[dtype]
    assert ((out.double() - ref).abs() - atol - rtol * ref.abs()).max().item() <= 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_run_and_generic_head_dim(dtype):
    # 20 query tokens of one sequence (more than one run), head_dim 80 (generic loop),
    # block size 8, and sequence order interleaved with a decode.
    check([40, 300, 9], [20, 1, 9], 6, 2, 80, dtype, block_size=8, seed=7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("max_parts", [1, 2, 0])
def test_key_partitions(dtype, max_parts):
    # Two sequences, long contexts: few (sequence, kv head) items, so with 2+ threads the keys
    # are split into partitions (max_parts=1 forbids it) and the partial softmaxes merged.
    check([1500, 700], [1, 3], 8, 2, 64, dtype, seed=3, max_parts=max_parts)


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128, 80])  # vector paths and generic loops
def test_8bit_pools(kv_dtype, dtype, head_dim):
    """int8 / fp8 pools with a bf16 scale per (slot, head), dequantized inside the kernel: the
    same bound as an unquantized pool holding the dequantized values (value * scale is exact
    in fp32)."""
    ctx, q_lens = [1, 17, 100, 257, 40], [1, 1, 5, 1, 16]
    q, kc, vc, bt, ts, tp = make_case(ctx, q_lens, 9, 3, head_dim, dtype, seed=11)
    kq, ks = quantize_kv(kc.float(), kv_dtype)
    vq, vs = quantize_kv(vc.float(), kv_dtype)
    fmt = 1 if kv_dtype == torch.int8 else 2
    # every byte value the writer can produce (fp8: all but the two NaN codes; subnormals too)
    codes = torch.tensor([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=torch.uint8)
    first = int(bt[3, 0]) * 16 * kq[0].numel()  # a block sequence 3 (257 keys) reads
    for pool in (kq, vq):
        pool.view(torch.uint8).view(-1)[first:first + len(codes)] = codes
    store = (lambda t: t) if fmt == 1 else (lambda t: t.view(torch.uint8))
    scale = head_dim ** -0.5
    out = ext.paged_attention_short(q, store(kq), store(vq), bt, ts, tp, 16, scale,
                                    k_scale=ks, v_scale=vs, kv_format=fmt)
    kd, vd = kq.double() * ks.double(), vq.double() * vs.double()
    ref = reference(q, kd, vd, bt, ts, tp, 16, scale)
    atol, rtol = TOL[dtype]
    assert ((out.double() - ref).abs() - atol - rtol * ref.abs()).max().item() <= 0
    with pytest.raises(RuntimeError, match="int8"):  # 8-bit pool without its format
        ext.paged_attention_short(q, store(kq), store(vq), bt, ts, tp, 16, scale)
    with pytest.raises(RuntimeError, match="scale"):
        ext.paged_attention_short(q, store(kq), store(vq), bt, ts, tp, 16, scale,
                                  kv_format=fmt)


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn])
def test_8bit_pools_hold_large_values(kv_dtype):
    """K and V of magnitude 1e5-1e8 (scales of 2^8 and up): fp8 rows read as inf, the factor
    scale * 2^120 of its widening past fp32's range (gcc formed it from f * 2^120 * scale)."""
    fmt = 1 if kv_dtype == torch.int8 else 2
    store = (lambda t: t) if fmt == 1 else (lambda t: t.view(torch.uint8))
    for big in (1e5, 1e8):
        q, kc, vc, bt, ts, tp = make_case([1, 17, 100, 257, 40], [1, 1, 5, 1, 16], 9, 3, 64,
                                          torch.float32, seed=11)
        q = q / big  # scores stay O(1)
        kq, ks = quantize_kv(kc.float() * big, kv_dtype)
        vq, vs = quantize_kv(vc.float() * big, kv_dtype)
        assert ks.float().max() >= 256
        out = ext.paged_attention_short(q, store(kq), store(vq), bt, ts, tp, 16, 0.125,
                                        k_scale=ks, v_scale=vs, kv_format=fmt)
        ref = reference(q, kq.double() * ks.double(), vq.double() * vs.double(), bt, ts, tp, 16,
                        0.125)
        assert ((out.double() - ref).abs() <= 1e-5 * ref.abs().max()).all()


def test_threads_agree():
    q, kc, vc, bt, ts, tp = make_case(CTX, [min(2, c) for c in CTX], 9, 3, 64, torch.float32)
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = ext.paged_attention_short(q, kc, vc, bt, ts, tp, 16, 0.125)
        torch.set_num_threads(2)
        b = ext.paged_attention_short(q, kc, vc, bt, ts, tp, 16, 0.125)
    finally:
        torch.set_num_threads(prev)
    assert torch.equal(a, b)  # no cross-thread reductions: bitwise identical


def test_empty_and_errors():
    q, kc, vc, bt, ts, tp = make_case([10], [1], 4, 2, 64, torch.float32)
    out = ext.paged_attention_short(q[:0], kc, vc, bt, ts[:0], tp[:0], 16, 0.125)
    assert out.shape == (0, 256)
    with pytest.raises((RuntimeError, ValueError)):
        ext.paged_attention_short(q, kc.bfloat16(), vc.bfloat16(), bt, ts, tp, 16, 0.125)
    with pytest.raises((RuntimeError, ValueError)):  # position beyond the block table
        ext.paged_attention_short(q, kc, vc, bt, ts, tp + 100, 16, 0.125)
    bad = bt.clone()
    bad[0, 0] = 10**6
    with pytest.raises((RuntimeError, ValueError)):  # block id beyond the cache
        ext.paged_attention_short(q, kc, vc, bad, ts, tp, 16, 0.125)
    # An empty head: refused, not a crash (AMX tiles of no rows; a division by head_dim)
    with pytest.raises(RuntimeError, match="head_dim must be positive"):
        ext.paged_attention_short(q[:, :0], kc, vc, bt, ts, tp, 16, 0.125)


def test_no_ext_env_disables():
    env = dict(os.environ, SPECSERVE_NO_EXT="1")
    code = ("from specserve.layers import paged_attention_ext as e; "
            "assert e.available() is False; assert e._module is None and not e._tried")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
