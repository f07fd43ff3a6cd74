"""Block manager: a pool of fixed-size KV blocks with reference counts and automatic prefix
caching.

A full block is identified by a chained hash of (parent block's hash, its token ids). A hit is
never trusted on the hash alone: the block keeps its tokens and the identity of its parent block,
and both are checked, so by induction a served prefix equals the request's prefix even under a
hash collision (Python's tuple hash is not collision-resistant; a collision only costs a miss).
Blocks whose reference count drops to zero stay cached in an LRU free queue and are evicted only
when a new block is needed.
"""

from __future__ import annotations

from collections import OrderedDict

from specserve.engine.request import Request


class Block:
    __slots__ = ("block_id", "ref_count", "block_hash", "token_ids", "parent", "generation")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: int | None = None
        self.token_ids: tuple[int, ...] | None = None
        # (block_id, generation) of the block before it in the sequence; for a first block,
        # None, or ("salt", cache_salt, LoRA load) for a salted or adapted request's.
        self.parent: tuple | None = None
        self.generation = 0  # bumped on every reuse, so a stale parent link never matches


def hash_block(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


def _salt(req) -> tuple[str, str | None, int | None] | None:
    """What comes before a request's first block: vLLM's cache_salt, so that requests with
    different salts (tenants) never share cached KV, nor learn from a hit's speed what another
    prompted; and the LoRA adapter, whose KV differs from the base model's for the same tokens
    (a draft model's requests have none: its KV is the same whatever the target's adapter)."""
    lora = getattr(req, "lora", None)
    lora_uid = None if lora is None else lora.uid
    if req.cache_salt is None and lora_uid is None:
        return None
    return ("salt", req.cache_salt, lora_uid)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in eviction order: uncached ones first, then cached ones least recent first.
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # block_hash -> block_id
        self.num_prefix_queries = 0  # prompt tokens looked up
        self.num_prefix_hits = 0  # of those, served from the cache

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def _request_hashes(self, req: Request, num_tokens: int) -> list[int]:
        """Chained hashes of the full blocks among the first num_tokens tokens (memoised)."""
        bs, hashes, ids = self.block_size, req.block_hashes, req.all_token_ids
        while (len(hashes) + 1) * bs <= num_tokens:
            i = len(hashes)
            parent = hashes[-1] if hashes else (None if (s := _salt(req)) is None else hash(s))
            hashes.append(hash_block(parent, tuple(ids[i * bs:(i + 1) * bs])))
        return hashes

    def prompt_block_hashes(self, req: Request) -> list[int]:
        """Chained hashes of req's full prompt blocks that a cache hit could serve (the last
        prompt token is always computed, for its logits)."""
        return self._request_hashes(req, req.num_prompt_tokens - 1)[
            :(req.num_prompt_tokens - 1) // self.block_size]

    def find_cached_prefix(self, req: Request) -> list[int]:
        """Block ids of the longest cached prefix of req. At least one token is always left to
        compute, because the last prompt position must produce logits (more while prompt
        logprobs are missing: Request.max_cached_prefix)."""
        if not self.enable_prefix_caching:
            return []
        limit = req.max_cached_prefix
        hashes = self._request_hashes(req, limit)[:limit // self.block_size]
        hit: list[int] = []
        parent = _salt(req)
        bs = self.block_size
        for i, h in enumerate(hashes):
            block_id = self.cached.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.parent != parent or \
                    block.token_ids != tuple(req.all_token_ids[i * bs:(i + 1) * bs]):
                break  # a hash collision: never serve another prefix's KV
            hit.append(block_id)
            parent = (block_id, block.generation)
        return hit

    def cached_prefix_hint(self, req: Request) -> int:
        """Tokens of req's prefix the cache likely holds (find_cached_prefix's answer, for a
        cost model asking at every step): hashes only, ~log2 of the prompt's blocks of them. A
        block's hash chains its whole prefix, and a prefix outlives its continuation in the LRU
        order, so the cached blocks of a request are a leading run: the longest one is found by
        bisection."""
        if not self.enable_prefix_caching or not self.cached:
            return 0
        limit = req.max_cached_prefix
        hashes = self._request_hashes(req, limit)[:limit // self.block_size]
        lo, hi = 0, len(hashes)  # the first lo blocks are cached; is block hi - 1?
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in self.cached:
                lo = mid
            else:
                hi = mid - 1
        return lo * self.block_size

    def record_prefix_lookup(self, num_queried: int, num_hit: int) -> None:
        """Counted once per request, at its first admission (a request retried at the queue
        head is not, nor one readmitted after a preemption: its own freed blocks would count as
        hits)."""
        if not self.enable_prefix_caching:
            return
        self.num_prefix_queries += num_queried
        self.num_prefix_hits += num_hit

    def blocks_to_add(self, req: Request, num_new_tokens: int) -> int:
        """How many blocks req lacks for num_computed_tokens + num_new_tokens (negative when it
        holds more than that)."""
        return -(-(req.num_computed_tokens + num_new_tokens) // self.block_size) - len(
            req.block_ids)

    def allocate(self, req: Request, num_new_tokens: int, cached_block_ids: list[int] = ()
                 ) -> bool:
        """Give req enough blocks for num_computed_tokens + num_new_tokens (after taking the
        cached prefix blocks). All or nothing: returns False and changes nothing if the pool is
        short."""
        num_new = self.blocks_to_add(req, num_new_tokens) - len(cached_block_ids)
        # Cached blocks that sit in the free queue are taken out of it, so count them.
        num_reused_free = sum(1 for b in cached_block_ids if self.blocks[b].ref_count == 0)
        if num_new > self.num_free_blocks - num_reused_free:
            return False
        for block_id in cached_block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_queue[block_id]
            block.ref_count += 1
            req.block_ids.append(block_id)
        for _ in range(max(num_new, 0)):
            block_id, _ = self.free_queue.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:  # evict the least recently used cached block
                if self.cached.get(block.block_hash) == block_id:
                    del self.cached[block.block_hash]
                block.block_hash = block.token_ids = block.parent = None
            block.generation += 1
            block.ref_count = 1
            req.block_ids.append(block_id)
        return True

    def cache_blocks(self, req: Request) -> None:
        """Register req's blocks that are full of computed tokens in the prefix cache. Called at
        every step for every running request, so it starts where the last call stopped
        (req.num_hashed_blocks) instead of walking a long context's blocks again.

        A block whose prefix the cache already holds (computed again: the last block of a
        prompt sent twice, a shared system prompt of requests admitted together) is swapped
        for the cached copy, and its own copy freed. Registered beside it, it left req's later
        blocks chained to a parent no lookup serves: a follow-up turn missed the whole reply."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        # A stop inside a run of accepted drafts leaves KV computed past the last token: never
        # register it.
        num_full = min(req.num_computed_tokens, len(req.all_token_ids)) // bs
        if num_full <= req.num_hashed_blocks:
            return
        hashes = self._request_hashes(req, num_full * bs)
        for i in range(req.num_hashed_blocks, num_full):
            block = self.blocks[req.block_ids[i]]
            if block.block_hash is not None:  # served from the cache at admission
                continue
            prev = self.blocks[req.block_ids[i - 1]] if i else None
            parent = (prev.block_id, prev.generation) if prev else _salt(req)
            token_ids = tuple(req.all_token_ids[i * bs:(i + 1) * bs])
            held = self.cached.get(hashes[i])
            if held is not None:
                copy = self.blocks[held]
                if copy.parent == parent and copy.token_ids == token_ids:
                    self._swap(req, i, copy)
                    continue
            block.parent, block.block_hash, block.token_ids = parent, hashes[i], token_ids
            self.cached.setdefault(hashes[i], block.block_id)
        req.num_hashed_blocks = num_full

    def _swap(self, req: Request, i: int, copy: Block) -> None:
        """Put the cached copy of req's block i in its place; the same tokens after the same
        prefix, so the same KV. req's own block was never registered: it is reused first."""
        if copy.ref_count == 0:
            del self.free_queue[copy.block_id]
        copy.ref_count += 1
        own = self.blocks[req.block_ids[i]]
        own.ref_count -= 1
        if own.ref_count == 0:
            self.free_queue[own.block_id] = None
            self.free_queue.move_to_end(own.block_id, last=False)
        req.block_ids[i] = copy.block_id

    def free(self, req: Request) -> None:
        """Drop req's references. Tail blocks are queued first so that a prefix outlives its
        continuation in the LRU order."""
        for block_id in reversed(req.block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue[block_id] = None
                if block.block_hash is None:  # nothing to keep: reuse it first
                    self.free_queue.move_to_end(block_id, last=False)
        req.block_ids = []
        req.num_hashed_blocks = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached block that no request holds (benchmarks measure cold prefills)."""
        for block_id in self.free_queue:
            block = self.blocks[block_id]
            block.block_hash = block.token_ids = block.parent = None
        self.cached = {h: b for h, b in self.cached.items() if self.blocks[b].ref_count > 0}
