"""What the proposers that run a network of their own (a draft model, an EAGLE head) share: a KV
pool of their own, sized by the engine from the shared budget (or explicitly), one sequence
state per request in it, and the draft probabilities stacked for rejection sampling."""

from __future__ import annotations

import torch

from specserve.config import CacheConfig
from specserve.engine.block_manager import BlockManager
from specserve.engine.model_runner import ModelRunner
from specserve.engine.request import Request
from specserve.spec_decode.proposer import Proposer

# Tokens per catch-up forward where attention materialises its scores (every path but the CPU
# kernel): the target's prefill chunk. One 32k-token forward would need tens of GiB there.
CATCH_UP_CHUNK = 512


class ProposerSeq:
    """The proposer's view of one request: the request's tokens, its own blocks and progress,
    and the guesses made in the current proposal."""

    seed_salt = 0  # mixed into the request's seed: the proposer's own random stream

    def __init__(self, req: Request):
        self.req = req
        self.num_computed_tokens = 0
        self.block_ids: list[int] = []
        self.block_hashes: list[int] = []
        self.num_hashed_blocks = 0  # see Request
        self.spec_token_ids: list[int] = []
        self.generator = None
        if req.params.seed is not None:  # the proposer's own stream: the target's stays intact
            self.generator = torch.Generator().manual_seed(req.params.seed ^ self.seed_salt)

    @property
    def all_token_ids(self) -> list[int]:
        return self.req.all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.req.all_token_ids)

    @property
    def cache_salt(self) -> str | None:
        return self.req.cache_salt

    @property
    def max_cached_prefix(self) -> int:
        """What the proposer's prefix cache may serve (Request.max_cached_prefix): all but the
        last token, whose logits propose."""
        return self.num_tokens - 1


class ModelProposer(Proposer):
    """Subclasses set `model` (the network whose KV cache the pool holds), `model_config`,
    `dtype`, `block_size`, `kv_bytes_per_token` and `kv_cache_memory` (None: the engine's
    share), and name their sequence state in `seq_type`."""

    seq_type: type[ProposerSeq] = ProposerSeq
    # Whether the network's KV at a position depends on the tokens up to it alone, so that
    # its pool may serve a prefix computed for another request (a draft model: yes; an EAGLE
    # head keeps KV only for a window of recent positions: no).
    prefix_cacheable: bool = False

    def __init__(self) -> None:
        super().__init__()
        self.seqs: dict[str, ProposerSeq] = {}
        self.num_forwards = 0
        self.num_tokens_computed = 0
        self.num_prefix_hit_tokens = 0  # tokens served from the pool's prefix cache
        self.time = 0.0

    def allocate_kv_cache(self, num_blocks: int, enable_prefix_caching: bool = False) -> None:
        if self.kv_cache_memory is not None:  # an explicit size for the proposer's pool
            num_blocks = max(self.kv_cache_memory // (self.block_size * self.kv_bytes_per_token),
                             1)
        self.runner = ModelRunner(self.model, self.model_config,
                                  CacheConfig(block_size=self.block_size), num_blocks, self.dtype)
        self.block_manager = BlockManager(
            num_blocks, self.block_size,
            enable_prefix_caching=enable_prefix_caching and self.prefix_cacheable)
        self.kv_cache_bytes = self.runner.kv_cache_bytes

    def reset_prefix_cache(self) -> None:
        self.block_manager.reset_prefix_cache()

    def _new_seq(self, req: Request) -> ProposerSeq:
        return self.seq_type(req)

    def _seq(self, req: Request) -> ProposerSeq:
        seq = self.seqs.get(req.request_id)
        if seq is None or seq.req is not req:
            seq = self.seqs[req.request_id] = self._new_seq(req)
        return seq

    def free(self, req: Request) -> None:
        seq = self.seqs.pop(req.request_id, None)
        if seq is not None:
            self.block_manager.free(seq)


def stack_probs(prob_rows: list[list[torch.Tensor]], need_probs: bool) -> torch.Tensor | None:
    """Per-request draft probability rows -> one [num guesses, vocab] tensor, in request order
    (what the rejection sampler reads), or None when no request samples."""
    if not need_probs:
        return None
    rows = [r for per_req in prob_rows for r in per_req]
    return torch.stack(rows) if rows else None
