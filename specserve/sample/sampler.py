"""Token sampling as pure tensor functions: greedy, temperature, min-p, top-k, top-p, per-request
seeds.

Random sampling uses the exponential-race trick, argmax(probs / Exp(1)) (as gpt-fast and vLLM do):
it needs no host sync and no cumulative sums. A seeded request draws its noise from its own
generator, so its tokens do not depend on what else is in the batch.
"""

from __future__ import annotations

import torch

from specserve.sample.argmax import argmax
from specserve.sample.rejection_sampler import sample_from_probs


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None,
                      top_p: torch.Tensor | None) -> torch.Tensor:
    """logits: [n, vocab]; top_k: [n] int (0 = off); top_p: [n] float (1 = off).
    Returns logits with the excluded tokens set to -inf."""
    if top_k is None and top_p is None:
        return logits
    if top_p is None:  # top-k alone: a threshold from topk, no full-vocabulary sort
        vocab = logits.shape[-1]
        k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)
        kth = logits.topk(int(k.max()), dim=-1).values.gather(1, (k - 1).unsqueeze(1))
        return logits.masked_fill(logits < kth, float("-inf"))
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)  # [n, vocab]
    vocab = logits.shape[-1]
    remove = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        # Every token tied with the k-th stays, as in the top-k-only path (and HF's and vLLM's
        # top-k). Cut at the k-th position, an unstable sort kept one of two tied tokens, and
        # bf16 logits tie often: a row's distribution changed with whether another request in
        # the batch set top_p.
        k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)
        remove |= sorted_logits < sorted_logits.gather(1, (k - 1).unsqueeze(1))
    if top_p is not None:
        probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p (keeps >= 1 token).
        # Rows with top_p = 1 (beside one that set it) drop nothing: fp32's cumsum may reach 1.0
        # before the tail, which would make a seeded row depend on its neighbours.
        mass_before = probs.cumsum(dim=-1) - probs
        remove |= (mass_before >= top_p.unsqueeze(1)) & (top_p < 1).unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, sorted_idx, sorted_logits)


def active_filters(params) -> tuple[bool, bool, bool]:
    """Whether any sampling request uses top-k, top-p, min-p: a filter nobody uses is skipped
    (top-p sorts the whole vocabulary). Only requests that sample count: a greedy one keeps
    the model's default filters (generation_config.json), and its token is its argmax."""
    sampling = [p for p in params if not p.is_greedy]
    return (any(p.top_k for p in sampling), any(p.top_p < 1 for p in sampling),
            any(p.min_p > 0 for p in sampling))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """min_p: [n] in [0, 1]. A token less likely than min_p times the row's likeliest is set to
    -inf (min_p 0 drops nothing; the likeliest always stays)."""
    probs = logits.softmax(dim=-1)
    floor = min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < floor, float("-inf"))


def compute_probs(logits: torch.Tensor, temperature: torch.Tensor,
                  top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                  min_p: torch.Tensor | None = None) -> torch.Tensor:
    """The target distribution a random request samples from: [n, vocab] fp32 probabilities.
    temperature: [n] (> 0). min-p applies to the tempered distribution, then top-k, then top-p,
    in vLLM's order. The same function feeds the rejection sampler, so speculative and plain
    sampling agree on what "the target's distribution" is."""
    logits = logits / temperature.unsqueeze(1)
    if min_p is not None:
        logits = apply_min_p(logits, min_p)
    return apply_top_k_top_p(logits, top_k, top_p).softmax(dim=-1)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None,
           top_p: torch.Tensor | None, generators: list[torch.Generator | None],
           min_p: torch.Tensor | None = None) -> torch.Tensor:
    """logits: [n, vocab] fp32 -> [n] sampled token ids. Rows with temperature 0 are greedy;
    only the random rows pay for the softmax, the filters and the noise."""
    tokens = argmax(logits)
    is_random = temperature >= 1e-5
    if not bool(is_random.any()):
        return tokens
    rows = is_random.nonzero().squeeze(1)
    probs = compute_probs(logits[rows], temperature[rows],
                          None if top_k is None else top_k[rows],
                          None if top_p is None else top_p[rows],
                          None if min_p is None else min_p[rows])
    gens = [generators[i] for i in rows.tolist()]
    return tokens.index_copy_(0, rows, sample_from_probs(probs, gens))
