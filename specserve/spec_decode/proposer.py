"""The proposer interface: something that guesses the next K tokens of running requests."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from specserve.engine.request import Request


@dataclass(slots=True)
class Proposal:
    token_ids: list[list[int]]  # per request, at most the K asked for (may be shorter or empty)
    # [sum of len(token_ids[i]), vocab] draft probabilities, or None for a point-mass proposer
    probs: torch.Tensor | None = None
    # per request, what its first guess rests on, in the proposer's own levels (n-gram: the
    # length of the matched suffix); None: the proposer gives no such evidence
    evidence: list[int] | None = None


class Proposer(ABC):
    name: str = "proposer"
    weight_bytes: int = 0
    kv_cache_bytes: int = 0
    kv_bytes_per_token: int = 0  # a draft model's KV cost per token (0: no cache)
    needs_hidden: bool = False  # wants the target's features after every forward (EAGLE)
    # Target layers whose residual streams come with those features (a fused-feature head)
    aux_layers: tuple[int, ...] = ()
    # Guessing costs next to nothing and no forward (n-gram, suffix): the engine may look the
    # guesses up before choosing K, and plan only for drafts that exist.
    free_lookahead: bool = False
    # Guesses from the replies of earlier requests (suffix decoding): a benchmark starts each
    # run with none and hides a prompt's earlier replies from its next request.
    learns_from_replies: bool = False
    # A separate draft model's own context length: no guess is made for a request longer than
    # it (its rotary table ends there); None: the target's.
    max_context: int | None = None

    def __init__(self) -> None:
        # (tokens, sequences, runs) of each draft forward since the engine last read them; runs:
        # (first position, tokens) per sequence, the context its attention read
        self.last_forwards: list[tuple[int, int, list[tuple[int, int]]]] = []

    def allocate_kv_cache(self, num_blocks: int,  # noqa: B027 (optional hook)
                          enable_prefix_caching: bool = False) -> None:
        """Size the proposer's own KV pool (the engine decides, from the shared budget), with
        automatic prefix caching where the engine has it and the proposer's KV allows it."""

    def reset_prefix_cache(self) -> None:  # noqa: B027 (optional hook)
        """Forget the cached prefixes of the proposer's own pool (with the engine's)."""

    def catch_up_tokens(self, req: Request) -> int:
        """Tokens the proposer must process before its first guess for req (cost model)."""
        return 0

    @abstractmethod
    def propose(self, reqs: list[Request], num_tokens: list[int]) -> Proposal:
        """Guess up to num_tokens[i] tokens that follow reqs[i].all_token_ids."""

    def on_target_hidden(self, hidden: torch.Tensor,  # noqa: B027 (optional hook)
                         rows: list[tuple[Request, int, int, int]]) -> None:
        """After a target forward (needs_hidden only): its hidden states [num_tokens, hidden *
        (1 + len(aux_layers))], and for each request (req, first position, first row, number
        of rows) of the positions that stayed valid. The tensor is the proposer's to keep."""

    def on_verified(self, req: Request, num_draft: int, num_accepted: int) -> None:  # noqa: B027
        """Called after verification (a stateful proposer rolls back its cache)."""

    def free(self, req: Request) -> None:  # noqa: B027 (optional hook)
        """The request finished, was aborted or preempted: drop its state."""

    def on_preempted(self, req: Request) -> None:
        """The request was preempted (it comes back later with the same tokens): free by
        default; a proposer may keep what its tokens still give it."""
        self.free(req)
