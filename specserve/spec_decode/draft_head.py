"""A draft LM head over part of the vocabulary (FR-Spec, Zhao et al. 2025).

A trained draft (specserve/train) may keep only the V' most likely token ids in its head: the
head matmul, often the largest part of a small draft's step, shrinks by vocab / V'. Its logits
are over those ids; proposed tokens are mapped back to vocabulary ids, and its probabilities are
scattered into a full-vocabulary row with zeros elsewhere.

Still lossless: rejection sampling only needs the draft's distribution q and samples from it.
A token outside the head has q = 0, so it is never proposed, and on a rejection the residual
max(p - q, 0) keeps the target's full mass p there; the output distribution is exactly p.
Greedy verification compares with the target's argmax, so a target argmax outside the head is
simply a rejection. Only the acceptance rate can suffer, never the output.
"""

from __future__ import annotations

import torch
from torch import nn

from specserve.sample.rejection_sampler import sample_from_probs
from specserve.sample.sampler import active_filters, compute_probs


def check_head_ids(head_ids: torch.Tensor, rows: int, vocab_size: int, where: str) -> None:
    """A reduced head's ids must name each row's token once, within the vocabulary: a repeated
    id would under-report q for its token (index_copy_ keeps one row), which rejection sampling
    would then accept too often (a hand-edited or mismatched head_ids.json)."""
    if head_ids.dim() != 1 or len(head_ids) != rows:
        raise ValueError(f"{where}: head ids name {len(head_ids)} tokens for a head of {rows} rows")
    if len(head_ids) and not (0 <= int(head_ids.min()) and int(head_ids.max()) < vocab_size):
        raise ValueError(f"{where}: head ids out of the vocabulary [0, {vocab_size})")
    if len(torch.unique(head_ids)) != len(head_ids):
        raise ValueError(f"{where}: head ids repeat a token")


def reduced_head(weight: torch.Tensor) -> nn.Linear:
    """An LM head with weight's rows ([V', hidden]), in weight's dtype."""
    head = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
    head.weight = nn.Parameter(weight.detach(), requires_grad=False)
    return head


def to_full_vocab_probs(probs: torch.Tensor, head_ids: torch.Tensor,
                        vocab_size: int) -> torch.Tensor:
    """[n, V'] probabilities over the head's ids -> [n, vocab_size], zero outside the head."""
    full = probs.new_zeros(probs.shape[0], vocab_size)
    return full.index_copy_(1, head_ids, probs)


def draft_tokens(logits: torch.Tensor, params: list, generators: list,
                 head_ids: torch.Tensor | None, vocab_size: int, need_probs: bool
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A draft's guesses from its logits [n, V'] (one row per request): the argmax for greedy
    requests, a sample from the request's filtered distribution otherwise. Returns the guesses as
    vocabulary ids [n] and, when need_probs, the draft probabilities [n, vocab_size]."""
    tokens = logits.argmax(dim=-1)
    probs = None
    if need_probs:
        temp = torch.tensor([p.temperature if not p.is_greedy else 1.0 for p in params])
        has_top_k, has_top_p, has_min_p = active_filters(params)  # as emit.py
        top_k = torch.tensor([p.top_k for p in params]) if has_top_k else None
        top_p = torch.tensor([p.top_p for p in params]) if has_top_p else None
        min_p = torch.tensor([p.min_p for p in params]) if has_min_p else None
        probs = compute_probs(logits, temp, top_k, top_p, min_p)
        sampled = sample_from_probs(probs, generators)
        tokens = torch.where(torch.tensor([p.is_greedy for p in params]), tokens, sampled)
        if head_ids is not None:
            probs = to_full_vocab_probs(probs, head_ids, vocab_size)
    if head_ids is not None:  # head rows -> vocabulary ids
        tokens = head_ids[tokens]
    return tokens, probs
