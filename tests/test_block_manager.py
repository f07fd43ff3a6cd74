"""Unit tests for the KV block pool (specserve/engine/block_manager.py): all-or-nothing
allocation, reference counts, prefix caching (hits, counters, hash collisions), LRU eviction
and reset. Pure Python; no model is loaded."""

from __future__ import annotations

import random

import pytest

from specserve.engine import block_manager as bm_module
from specserve.engine.block_manager import BlockManager
from specserve.engine.request import Request
from specserve.sampling_params import SamplingParams

BS = 4  # block size used throughout


# ---- helpers ---------------------------------------------------------------------------------
def toks(seed: int, n: int) -> list[int]:
    """n token ids that no other seed shares."""
    return [seed * 1000 + i for i in range(n)]


def make_req(tokens: list[int], rid: str = "r", salt: str | None = None) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=64, cache_salt=salt))


def blocks_for(n_tokens: int) -> int:
    return -(-n_tokens // BS)


def prefill(bm: BlockManager, req: Request) -> list[int]:
    """Admit req the way the scheduler does (cached prefix, then the rest), mark the whole
    prompt computed and register its full blocks. Returns the prefix-cache hit."""
    hit = bm.find_cached_prefix(req)
    req.num_computed_tokens = len(hit) * BS
    assert bm.allocate(req, req.num_tokens - req.num_computed_tokens, hit)
    bm.record_prefix_lookup(req.num_tokens, len(hit) * BS)
    req.num_computed_tokens = req.num_tokens
    bm.cache_blocks(req)
    return hit


def probe(bm: BlockManager, tokens: list[int], salt: str | None = None) -> list[int]:
    """Block ids a fresh request with these tokens would be served (no allocation); counted
    as a lookup, as the scheduler does when it admits a request."""
    req = make_req(tokens, "probe", salt)
    hit = bm.find_cached_prefix(req)
    bm.record_prefix_lookup(req.num_tokens, len(hit) * BS)
    return hit


def check_invariants(bm: BlockManager, live: list[Request], registered: bool = False) -> None:
    """registered: cache_blocks ran on every live request since its last computed token."""
    counts = [0] * bm.num_blocks
    for req in live:
        for b in req.block_ids:
            counts[b] += 1
    assert [blk.ref_count for blk in bm.blocks] == counts
    assert set(bm.free_queue) == {b for b, c in enumerate(counts) if c == 0}
    for h, b in bm.cached.items():
        assert bm.blocks[b].block_hash == h
        assert bm.blocks[b].token_ids is not None
    for req in live if registered else ():
        # cache_blocks resumes where it stopped: it must have skipped nothing
        full = req.num_computed_tokens // BS
        assert all(bm.blocks[b].block_hash is not None for b in req.block_ids[:full])


def free_order_ok(bm: BlockManager) -> bool:
    """Free queue = uncached blocks first, then cached ones."""
    cached = [bm.blocks[b].block_hash is not None for b in bm.free_queue]
    return cached == sorted(cached)


# ---- allocation and reference counts -----------------------------------------------------------
def test_allocate_counts_blocks_and_is_all_or_nothing():
    bm = BlockManager(4, BS)
    a = make_req(toks(1, 9), "a")
    assert bm.allocate(a, 9)
    assert len(a.block_ids) == 3 and bm.num_free_blocks == 1
    assert bm.allocate(a, 0)  # already covered: nothing new
    assert len(a.block_ids) == 3
    b = make_req(toks(2, 8), "b")
    before = (list(bm.free_queue), [blk.ref_count for blk in bm.blocks])
    assert not bm.allocate(b, 8)  # needs 2, one is free
    assert b.block_ids == []
    assert (list(bm.free_queue), [blk.ref_count for blk in bm.blocks]) == before
    assert bm.allocate(b, 4)
    assert bm.num_free_blocks == 0 and bm.usage == 1.0
    check_invariants(bm, [a, b])


def test_allocate_grows_incrementally_from_computed_tokens():
    bm = BlockManager(8, BS)
    r = make_req(toks(1, 6))
    assert bm.allocate(r, 3)
    assert len(r.block_ids) == 1
    r.num_computed_tokens = 3
    assert bm.allocate(r, 2)  # 5 tokens -> 2 blocks
    assert len(r.block_ids) == 2
    r.num_computed_tokens = 5
    assert bm.allocate(r, 3)  # 8 tokens -> still 2 blocks
    assert len(r.block_ids) == 2
    assert len(set(r.block_ids)) == 2
    check_invariants(bm, [r])


def test_all_or_nothing_counts_cached_blocks_taken_from_the_free_queue():
    bm = BlockManager(3, BS)
    a = make_req(toks(1, 2 * BS + 1), "a")
    prefill(bm, a)
    a_ids = list(a.block_ids)
    bm.free(a)  # 2 cached + 1 uncached free blocks
    b = make_req(toks(1, 2 * BS) + toks(2, 9), "b")  # 17 tokens = 5 blocks, 2 of them cached
    hit = bm.find_cached_prefix(b)
    assert hit == a_ids[:2]
    before = (list(bm.free_queue), dict(bm.cached), [blk.ref_count for blk in bm.blocks])
    b.num_computed_tokens = len(hit) * BS
    assert not bm.allocate(b, b.num_tokens - b.num_computed_tokens, hit)  # 3 new, 1 left
    assert b.block_ids == []
    assert (list(bm.free_queue), dict(bm.cached), [blk.ref_count for blk in bm.blocks]) == before
    check_invariants(bm, [])


def test_shared_prefix_ref_counts_and_free():
    bm = BlockManager(16, BS)
    a = make_req(toks(1, 3 * BS + 2), "a")
    prefill(bm, a)
    b = make_req(toks(1, 2 * BS) + toks(2, 5), "b")
    hit = prefill(bm, b)
    shared = a.block_ids[:2]
    assert hit == shared and b.block_ids[:2] == shared
    assert [bm.blocks[i].ref_count for i in shared] == [2, 2]
    assert set(a.block_ids[2:]).isdisjoint(b.block_ids[2:])
    check_invariants(bm, [a, b])
    bm.free(a)
    assert a.block_ids == []
    assert [bm.blocks[i].ref_count for i in shared] == [1, 1]
    assert not set(shared) & set(bm.free_queue)
    check_invariants(bm, [b])
    bm.free(b)
    assert bm.num_free_blocks == 16
    assert all(blk.ref_count == 0 for blk in bm.blocks)
    check_invariants(bm, [])


def test_free_returns_every_block():
    bm = BlockManager(32, BS)
    rng = random.Random(0)
    reqs = [make_req(toks(i, rng.randint(1, 20)), f"r{i}") for i in range(6)]
    for r in reqs:
        prefill(bm, r)
        assert len(r.block_ids) == blocks_for(r.num_tokens)
    used = sum(len(r.block_ids) for r in reqs)
    assert bm.num_free_blocks == 32 - used
    for r in rng.sample(reqs, len(reqs)):
        bm.free(r)
    assert bm.num_free_blocks == 32 and bm.usage == 0.0
    assert sorted(bm.free_queue) == list(range(32))
    check_invariants(bm, [])


# ---- prefix cache ------------------------------------------------------------------------------
def test_prefix_hit_returns_the_same_block_ids_and_moves_counters():
    bm = BlockManager(16, BS)
    a = make_req(toks(1, 3 * BS + 2), "a")
    assert prefill(bm, a) == []
    assert (bm.num_prefix_queries, bm.num_prefix_hits) == (a.num_tokens, 0)
    b = make_req(toks(1, 3 * BS) + toks(2, 3), "b")
    hit = probe(bm, b.all_token_ids)
    assert hit == a.block_ids[:3]
    assert bm.num_prefix_queries == a.num_tokens + b.num_tokens
    assert bm.num_prefix_hits == 3 * BS
    # Differs inside the second block: only the first block is served.
    c = toks(1, BS) + [7] + toks(1, 2 * BS)[BS + 1:] + [1, 2, 3]
    assert probe(bm, c) == a.block_ids[:1]
    assert bm.num_prefix_hits == 4 * BS


def test_chained_hash_needs_the_same_prefix_not_just_the_same_block():
    bm = BlockManager(16, BS)
    a = make_req(toks(1, 3 * BS + 1), "a")
    prefill(bm, a)
    # A's second block, but at position 0 / after a different first block: no hit.
    assert probe(bm, toks(1, 2 * BS)[BS:] + [5]) == []
    assert probe(bm, toks(9, BS) + toks(1, 2 * BS)[BS:] + [5]) == []


def test_a_cache_salt_shares_a_prefix_only_with_the_same_salt():
    bm = BlockManager(16, BS)
    prompt = toks(1, 3 * BS + 1)
    a = make_req(prompt, "a", salt="tenant-a")
    prefill(bm, a)
    assert probe(bm, prompt) == [] and probe(bm, prompt, "tenant-b") == []
    assert probe(bm, prompt, "tenant-a") == a.block_ids[:3]
    b = make_req(prompt, "b")  # unsalted: its own blocks, served to unsalted requests only
    prefill(bm, b)
    assert probe(bm, prompt) == b.block_ids[:3] != a.block_ids[:3]


def test_hash_collision_does_not_serve_another_salts_block(monkeypatch):
    monkeypatch.setattr(bm_module, "hash_block", lambda parent, token_ids: 12345)
    bm = BlockManager(16, BS)
    prompt = toks(1, BS + 1)
    prefill(bm, make_req(prompt, "a", salt="tenant-a"))
    assert probe(bm, prompt, "tenant-b") == [] and probe(bm, prompt) == []


@pytest.mark.parametrize("k", [1, 2, 3])
def test_at_least_one_token_is_left_to_compute(k):
    bm = BlockManager(16, BS)
    a = make_req(toks(1, k * BS + 1), "a")
    prefill(bm, a)  # k full blocks cached
    queries = bm.num_prefix_queries
    hit = probe(bm, toks(1, k * BS))  # exactly k full blocks
    assert hit == a.block_ids[:k - 1]
    assert bm.num_prefix_hits == (k - 1) * BS
    assert bm.num_prefix_queries == queries + k * BS
    assert probe(bm, toks(1, k * BS + 1)) == a.block_ids[:k]


def test_only_computed_full_blocks_are_cached():
    bm = BlockManager(16, BS)
    a = make_req(toks(1, 3 * BS), "a")
    assert bm.allocate(a, 3 * BS)
    a.num_computed_tokens = BS + 2  # a prefill chunk
    bm.cache_blocks(a)
    assert probe(bm, toks(1, 3 * BS)) == a.block_ids[:1]
    a.num_computed_tokens = 3 * BS
    bm.cache_blocks(a)
    assert probe(bm, toks(1, 3 * BS + 1)) == a.block_ids


def test_a_request_freed_and_admitted_again_registers_its_new_blocks():
    """cache_blocks starts at the blocks it registered last time: preemption frees them all,
    so a readmitted request whose old blocks were evicted must register its new ones."""
    bm = BlockManager(4, BS)
    a = make_req(toks(1, 2 * BS), "a")
    prefill(bm, a)
    assert a.num_hashed_blocks == 2
    bm.free(a)  # preempted
    b = make_req(toks(2, 4 * BS), "b")
    prefill(bm, b)  # evicts a's blocks
    bm.free(b)
    a.num_computed_tokens = 0
    prefill(bm, a)
    assert a.num_hashed_blocks == 2
    assert probe(bm, toks(1, 2 * BS) + [0]) == a.block_ids


def _decode(bm: BlockManager, req: Request, tokens: list[int]) -> None:
    """req samples these tokens one step at a time, each step's KV registered as the engine
    does."""
    for t in tokens:
        req.append_token(t)
        assert bm.allocate(req, req.num_tokens - req.num_computed_tokens)
        req.num_computed_tokens = req.num_tokens
        bm.cache_blocks(req)


def test_a_block_computed_twice_is_swapped_for_the_cached_copy():
    """A prompt of whole blocks sent twice: its last block is always computed again (its last
    token needs logits). The second request's copy is swapped for the cached one and freed, so
    a follow-up turn on the second reply is served the whole reply, not just the prompt."""
    bm = BlockManager(16, BS)
    prompt = toks(1, 2 * BS)
    a, b = make_req(prompt, "a"), make_req(prompt, "b")
    prefill(bm, a)
    _decode(bm, a, toks(2, BS))
    free_before = bm.num_free_blocks
    assert len(prefill(bm, b)) == 1  # the last prompt block is computed again...
    assert b.block_ids == a.block_ids[:2]  # ...and swapped for a's copy
    assert bm.num_free_blocks == free_before  # b holds a's blocks: nothing more taken
    _decode(bm, b, toks(3, BS))
    assert probe(bm, prompt + toks(3, BS) + [7]) == b.block_ids[:3]
    check_invariants(bm, [a, b], registered=True)
    assert free_order_ok(bm)


def test_requests_admitted_together_share_their_common_blocks_after_the_step():
    """Two requests with a common first block, admitted in one step, both compute it: the
    second registered is swapped for the first's copy, and its own continuation is found."""
    bm = BlockManager(16, BS)
    a = make_req(toks(1, BS) + toks(2, BS), "a")
    b = make_req(toks(1, BS) + toks(3, BS), "b")
    for req in (a, b):  # both allocated before either is registered
        assert bm.allocate(req, req.num_tokens)
    for req in (a, b):
        req.num_computed_tokens = req.num_tokens
        bm.cache_blocks(req)
    assert b.block_ids[0] == a.block_ids[0]
    assert probe(bm, toks(1, BS) + toks(3, BS) + [7]) == b.block_ids
    check_invariants(bm, [a, b], registered=True)


def test_kv_computed_past_the_last_token_is_never_registered():
    """A stop inside a run of accepted drafts: the KV of the drafts after it was computed, but
    the tokens were dropped. Only blocks within the request's tokens are registered."""
    bm = BlockManager(16, BS)
    a = make_req(toks(1, BS + 1), "a")
    assert bm.allocate(a, 2 * BS)
    a.num_computed_tokens = 2 * BS  # computed through drafts that the stop cut off
    bm.cache_blocks(a)
    assert a.num_hashed_blocks == 1
    assert bm.blocks[a.block_ids[1]].block_hash is None
    assert len(bm.cached) == 1


def test_prefix_caching_disabled():
    bm = BlockManager(16, BS, enable_prefix_caching=False)
    a = make_req(toks(1, 2 * BS + 1), "a")
    prefill(bm, a)
    bm.free(a)
    assert probe(bm, toks(1, 2 * BS + 1)) == []
    assert (bm.num_prefix_queries, bm.num_prefix_hits) == (0, 0)
    assert bm.cached == {}


def _constant_hash(monkeypatch):
    monkeypatch.setattr(bm_module, "hash_block", lambda parent, token_ids: 12345)


def test_hash_collision_does_not_serve_a_different_block(monkeypatch):
    _constant_hash(monkeypatch)
    bm = BlockManager(16, BS)
    x, y, z = toks(1, BS), toks(2, BS), toks(3, BS)
    a = make_req(x + y + [0], "a")
    prefill(bm, a)
    assert probe(bm, z + y + [0]) == []  # same hash, different tokens: verified, not served
    hits = bm.num_prefix_hits
    assert probe(bm, x + y + [0]) == a.block_ids[:1]  # the genuine first block still hits
    assert bm.num_prefix_hits == hits + BS


def test_hash_collision_does_not_serve_a_block_with_a_different_parent(monkeypatch):
    _constant_hash(monkeypatch)
    bm = BlockManager(16, BS)
    x, y = toks(1, BS), toks(2, BS)
    a = make_req(x + y + [0], "a")  # cached: block0 = x (after nothing), block1 = y (after x)
    prefill(bm, a)
    # B = x + x: its second block's tokens equal A's *first* block, which was computed at
    # positions 0..BS-1 with no parent. Only B's first block may be served.
    assert probe(bm, x + x + [0]) == a.block_ids[:1]


def test_hash_collision_never_serves_one_block_twice(monkeypatch):
    _constant_hash(monkeypatch)
    bm = BlockManager(16, BS)
    x = toks(1, BS)
    a = make_req(x + x + [0], "a")
    prefill(bm, a)
    hit = probe(bm, x + x + [0])
    assert len(set(hit)) == len(hit)
    assert hit == a.block_ids[:len(hit)]


# ---- LRU eviction ------------------------------------------------------------------------------
def _three_freed_requests(bm: BlockManager) -> tuple[list[Request], list[int], list[int]]:
    """r0, r1, r2 each hold 1 full (cached) + 1 partial (uncached) block; freed in that order."""
    reqs = [make_req(toks(i, BS + 1), f"r{i}") for i in range(3)]
    for r in reqs:
        prefill(bm, r)
    full = [r.block_ids[0] for r in reqs]
    partial = [r.block_ids[1] for r in reqs]
    for r in reqs:
        bm.free(r)
    assert free_order_ok(bm)
    return reqs, full, partial


def _take(bm: BlockManager, n_blocks: int, seed: int) -> Request:
    r = make_req(toks(seed, n_blocks * BS), f"take{seed}")
    assert bm.allocate(r, n_blocks * BS)
    return r


def test_uncached_free_blocks_are_reused_before_cached_ones():
    bm = BlockManager(6, BS)
    reqs, full, partial = _three_freed_requests(bm)
    t = _take(bm, 3, 50)
    assert sorted(t.block_ids) == sorted(partial)
    for r, f in zip(reqs, full, strict=True):
        assert probe(bm, r.prompt_token_ids) == [f]
    check_invariants(bm, [t])


def test_never_used_blocks_are_reused_before_cached_ones():
    bm = BlockManager(8, BS)
    a = make_req(toks(1, 2 * BS), "a")
    prefill(bm, a)
    a_ids = list(a.block_ids)
    bm.free(a)
    t = _take(bm, 6, 50)
    assert not set(t.block_ids) & set(a_ids)
    assert probe(bm, toks(1, 2 * BS + 1)) == a_ids


def test_cached_free_blocks_are_evicted_oldest_first():
    bm = BlockManager(6, BS)
    reqs, full, _ = _three_freed_requests(bm)
    live = [_take(bm, 3, 50)]  # the uncached ones
    live.append(_take(bm, 1, 51))
    assert live[-1].block_ids == [full[0]]
    assert probe(bm, reqs[0].prompt_token_ids) == []
    assert full[0] not in bm.cached.values()
    assert probe(bm, reqs[1].prompt_token_ids) == [full[1]]
    live.append(_take(bm, 1, 52))
    assert live[-1].block_ids == [full[1]]
    assert probe(bm, reqs[2].prompt_token_ids) == [full[2]]
    check_invariants(bm, live)


def test_a_hit_refreshes_the_lru_position():
    bm = BlockManager(6, BS)
    reqs, full, _ = _three_freed_requests(bm)
    again = make_req(reqs[0].prompt_token_ids, "again")
    assert prefill(bm, again) == [full[0]]
    bm.free(again)  # full[0] is now the most recently used
    live = [_take(bm, 3, 50), _take(bm, 1, 51), _take(bm, 1, 52), _take(bm, 1, 53)]
    assert [r.block_ids for r in live[1:]] == [[full[1]], [full[2]], [full[0]]]


def test_a_prefix_outlives_its_continuation():
    bm = BlockManager(4, BS)
    a = make_req(toks(1, 3 * BS + 1), "a")  # 3 full + 1 partial block
    prefill(bm, a)
    ids = list(a.block_ids)
    bm.free(a)
    t1 = _take(bm, 1, 50)
    assert t1.block_ids == [ids[3]]  # the uncached partial block
    t2 = _take(bm, 1, 51)
    assert t2.block_ids == [ids[2]]  # then the tail of the prefix
    assert probe(bm, toks(1, 3 * BS + 1)) == ids[:2]


def test_an_evicted_and_reallocated_block_no_longer_hits():
    bm = BlockManager(2, BS)
    a = make_req(toks(1, BS + 1), "a")
    prefill(bm, a)
    old = a.block_ids[0]
    bm.free(a)
    b = make_req(toks(2, 2 * BS), "b")
    assert prefill(bm, b) == []
    assert old in b.block_ids  # evicted and rewritten with b's tokens
    assert probe(bm, toks(1, BS + 1)) == []
    assert probe(bm, toks(2, 2 * BS + 1)) == b.block_ids  # now it serves b's prefix
    check_invariants(bm, [b])


# ---- reset ----------------------------------------------------------------------------------
def test_reset_prefix_cache_forgets_free_blocks_and_keeps_blocks_in_use():
    bm = BlockManager(16, BS)
    held = make_req(toks(1, 2 * BS + 1), "held")
    prefill(bm, held)
    gone = make_req(toks(2, 2 * BS + 1), "gone")
    prefill(bm, gone)
    bm.free(gone)
    free_before = bm.num_free_blocks
    bm.reset_prefix_cache()
    assert bm.num_free_blocks == free_before
    assert probe(bm, toks(2, 2 * BS + 1)) == []
    assert probe(bm, toks(1, 2 * BS + 1)) == held.block_ids[:2]
    assert all(bm.blocks[b].block_hash is None for b in bm.free_queue)
    check_invariants(bm, [held])
    held_ids = list(held.block_ids)
    bm.free(held)  # still cached once released
    assert probe(bm, toks(1, 2 * BS + 1)) == held_ids[:2]
    # A fresh request recomputes "gone" and caches it again.
    again = make_req(toks(2, 2 * BS + 1), "again")
    assert prefill(bm, again) == []
    assert probe(bm, toks(2, 2 * BS + 1)) == again.block_ids[:2]


# ---- randomized invariants ---------------------------------------------------------------------
def _kv_oracle_step(bm: BlockManager, req: Request, content: dict[int, tuple[int, ...]]) -> None:
    """content[block] = the full token prefix whose KV the block holds. Newly written full
    blocks are recorded; already recorded ones must match the request's prefix."""
    ids = req.all_token_ids
    for i in range(req.num_computed_tokens // BS):
        expected = tuple(ids[:(i + 1) * BS])
        assert content.setdefault(req.block_ids[i], expected) == expected


def test_random_workload_keeps_invariants_and_serves_only_matching_kv():
    rng = random.Random(1234)
    bm = BlockManager(24, BS)
    prefixes = [[rng.randrange(3) for _ in range(rng.randint(1, 12))] for _ in range(4)]
    live: list[Request] = []
    content: dict[int, tuple[int, ...]] = {}
    num_hit_blocks = 0
    for step in range(600):
        op = rng.random()
        if op < 0.35:
            tokens = rng.choice(prefixes) + [rng.randrange(3) for _ in range(rng.randint(1, 6))]
            req = make_req(tokens, f"q{step}")
            hit = bm.find_cached_prefix(req)
            for i, b in enumerate(hit):
                assert content[b] == tuple(tokens[:(i + 1) * BS])
            req.num_computed_tokens = len(hit) * BS
            if bm.allocate(req, req.num_tokens - req.num_computed_tokens, hit):
                num_hit_blocks += len(hit)
                for b in req.block_ids[len(hit):]:
                    content.pop(b, None)  # fresh block: its old KV is overwritten
                req.num_computed_tokens = req.num_tokens
                bm.cache_blocks(req)
                _kv_oracle_step(bm, req, content)
                req.append_token(rng.randrange(3))
                live.append(req)
            else:
                req.num_computed_tokens = 0
                assert req.block_ids == []
        elif op < 0.75 and live:
            req = rng.choice(live)
            k = rng.randint(0, 3)  # decode with k draft tokens, some accepted
            old = list(req.block_ids)
            if bm.allocate(req, 1 + k):
                for b in req.block_ids[len(old):]:
                    content.pop(b, None)
                accepted = rng.randint(0, k)
                for _ in range(accepted + 1):
                    req.append_token(rng.randrange(3))
                # As the engine does, the blocks of rejected drafts stay with the request
                # (the next tokens reuse them); their stale KV is never registered.
                req.num_computed_tokens = req.num_tokens - 1
                bm.cache_blocks(req)
                _kv_oracle_step(bm, req, content)
        elif live:
            req = live.pop(rng.randrange(len(live)))
            bm.free(req)
        check_invariants(bm, live, registered=True)
    assert num_hit_blocks > 20  # the workload did exercise the cache
    for req in live:
        bm.free(req)
    assert bm.num_free_blocks == bm.num_blocks
    check_invariants(bm, [])
