"""Lossless rejection sampling for speculative decoding.

A cheap proposer (a draft model, or an n-gram lookup) guesses ``K`` tokens ahead; the target model
scores all of them in one forward pass, giving ``K + 1`` target distributions per request (one
for each draft position, plus one after the last draft). Rejection sampling then decides how
many of the guesses to keep such that the emitted tokens are distributed *exactly* as if they had
been sampled from the target model one at a time:

- Leviathan, Kalman & Matias, 2023. "Fast Inference from Transformers via Speculative
  Decoding." ICML 2023. arXiv:2211.17192. (Algorithm 1, Appendix A.1 for the proof.)
- Chen, Borgeaud, Irving, Lespiau, Sifre & Jumper, 2023. "Accelerating Large Language Model
  Decoding with Speculative Sampling." arXiv:2302.01318. (Algorithm 2, Theorem 1.)

Terms used throughout:

- **draft tokens** ``x_1 .. x_K``: the proposer's guesses, with draft probabilities ``p_d``.
- **accepted tokens**: the prefix of the draft tokens the target keeps. Draft ``x_j`` is accepted
  with probability ``min(1, p_t(x_j) / p_d(x_j))``, and only if ``x_1 .. x_{j-1}`` were.
- **recovered token**: at the first rejected position ``j``, a replacement is sampled from the
  residual distribution ``norm(max(p_t - p_d, 0))``. Accepting with the ratio above and recovering
  from the residual together give exactly ``p_t`` at that position (the losslessness theorem).
- **bonus token**: if all ``K`` drafts are accepted, one more token is sampled from the target's
  distribution at position ``K`` for free, since the target pass computed it anyway.

Every request therefore emits its accepted tokens followed by exactly one recovered or bonus
token: between 1 and ``K + 1`` tokens per target forward pass.

Greedy requests are the temperature -> 0 limit: a draft is accepted while it equals the target's
argmax, and the recovered/bonus token is the target's argmax.

Proposers with no distribution (n-gram / prompt lookup) are handled by treating the draft as a
point mass on the proposed token: acceptance probability becomes ``p_t(x_j)``, and the residual
is ``p_t`` with ``x_j`` removed. This is lossless for *any* way of choosing the draft token.

Randomness: a request with its own ``torch.Generator`` (a seeded request) takes every random draw
from it, in a fixed order per call (``K`` acceptance uniforms, then one ``Exp(1)`` vector over the
vocabulary for the recovered/bonus token), so its output does not depend on which other requests
share the batch. Requests without a generator share the global default generator. Greedy
requests draw nothing, and a batch of only greedy requests skips the random path entirely.
"""

from __future__ import annotations

import torch

from specserve.sample.argmax import argmax

# Pads ``output_token_ids`` past each request's emitted tokens.
PLACEHOLDER_TOKEN_ID = -1


def exponential_noise(
    shape: tuple[int, int],
    generators: list[torch.Generator | None] | None,
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Draws ``Exp(1)`` noise of ``shape`` = [num_rows, vocab_size], row ``i`` from
    ``generators[i]`` when it is not None, otherwise from the default generator.

    Values are clamped away from zero: ``q / 0`` would give ``inf`` or ``nan`` (for ``q = 0``),
    and ``argmax`` treats ``nan`` as the maximum, which would pick a zero-probability token.
    """
    noise = torch.empty(shape, device=device, dtype=dtype)  # [num_rows, vocab_size]
    if generators is None or any(g is None for g in generators):
        noise.exponential_()
    if generators is not None:
        for i, generator in enumerate(generators):
            if generator is not None:
                noise[i].exponential_(generator=generator)
    return noise.clamp_(min=torch.finfo(dtype).tiny)


def sample_with_noise(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The exponential race: ``argmax_v probs[v] / E[v]`` with ``E[v] ~ Exp(1)`` i.i.d.

    ``E[v] / probs[v]`` is exponential with rate ``probs[v]``, and the smallest of independent
    exponentials is index ``v`` with probability ``probs[v] / sum(probs)``. So this samples
    from ``norm(probs)``: rows need not be normalised, only non-negative with a positive sum.
    Equivalent to the Gumbel-max trick, without a log, and with no host sync (unlike
    ``torch.multinomial``).

    probs: [num_rows, vocab_size]; noise: [num_rows, vocab_size]. Returns [num_rows] int64.
    """
    return argmax(probs.div(noise))


def sample_from_probs(
    probs: torch.Tensor,
    generators: list[torch.Generator | None] | None = None,
) -> torch.Tensor:
    """Samples one token per row of ``probs`` ([num_rows, vocab_size], rows need not be
    normalised), row ``i`` using ``generators[i]`` when given. Returns [num_rows] int64."""
    noise = exponential_noise(tuple(probs.shape), generators, probs.device, probs.dtype)
    return sample_with_noise(probs, noise)


def _draw_uniforms(
    num_draft_tokens: list[int],
    generators: list[torch.Generator | None],
    device: torch.device,
    dtype: torch.dtype,
) -> torch.Tensor:
    """One uniform per draft token [num_draft_tokens], for acceptance. Unseeded requests share
    one vectorised draw from the default generator; a seeded request draws its ``K_i`` uniforms
    from its own generator (and later its noise row, in ``exponential_noise``), so the state a
    seeded generator sees depends only on that request."""
    uniforms = torch.empty(sum(num_draft_tokens), device=device, dtype=dtype)
    if any(g is None for g in generators):
        uniforms.uniform_()
    start = 0
    for k, generator in zip(num_draft_tokens, generators, strict=True):
        if generator is not None:
            uniforms[start : start + k].uniform_(generator=generator)
        start += k
    return uniforms


def _accept_random(
    draft_token_ids: torch.Tensor,  # [num_draft]
    draft_probs: torch.Tensor | None,  # [num_draft, V] or None (point masses)
    target_probs: torch.Tensor,  # [num_draft + batch, V]
    target_row_of_token: torch.Tensor,  # [num_draft]
    num_draft_tokens: list[int],
    generators: list[torch.Generator | None],
    greedy_of_token: torch.Tensor,  # [num_draft] bool
    accept_greedy: torch.Tensor,  # [num_draft] bool
) -> torch.Tensor:
    """Accept x with probability min(1, p_t(x) / p_d(x)), written as u * p_d < p_t to avoid
    dividing by zero (p_d(x) = 0 then accepts iff p_t(x) > 0); greedy requests' tokens keep
    their greedy verdict. Returns [num_draft] bool."""
    num_draft = len(draft_token_ids)
    uniforms = _draw_uniforms(num_draft_tokens, generators, target_probs.device,
                              target_probs.dtype)
    p_target = target_probs[target_row_of_token, draft_token_ids]  # [num_draft]
    if draft_probs is None:
        p_draft = torch.ones_like(p_target)  # point mass on the draft token
    else:
        p_draft = draft_probs[torch.arange(num_draft, device=p_target.device), draft_token_ids]
    return torch.where(greedy_of_token, accept_greedy, uniforms * p_draft < p_target)


def _final_random(
    target_probs: torch.Tensor,  # [num_draft + batch, V]
    draft_probs: torch.Tensor | None,  # [num_draft, V] or None
    draft_token_ids: torch.Tensor,  # [num_draft]
    final_rows: torch.Tensor,  # [batch] target row of each request's final position
    draft_starts: torch.Tensor,  # [batch]
    num_accepted: torch.Tensor,  # [batch]
    k: torch.Tensor,  # [batch] drafts per request
    num_draft: int,
    generators: list[torch.Generator | None],
    is_greedy: torch.Tensor,  # [batch]
    target_argmax: torch.Tensor,  # [num_draft + batch]
) -> torch.Tensor:
    """The recovered token (from the residual, after a rejection) or the bonus token (from p_t)
    of every request; greedy requests take the argmax. Returns [batch] int64."""
    final_probs = target_probs[final_rows]  # [batch, V] (a copy)
    noise = exponential_noise(tuple(final_probs.shape), generators, final_probs.device,
                              final_probs.dtype)
    if num_draft > 0:
        rejected = num_accepted < k  # [batch]
        # For bonus rows this index is meaningless (possibly out of range): clamp, then discard.
        rejected_draft = (draft_starts + num_accepted).clamp(max=num_draft - 1)  # [batch]
        if draft_probs is None:
            # max(p_t - onehot(x), 0) is p_t with x zeroed (since p_t(x) <= 1).
            residual = final_probs.scatter(-1, draft_token_ids[rejected_draft, None], 0.0)
        else:
            residual = (final_probs - draft_probs[rejected_draft]).clamp_(min=0.0)
        # p_t == p_d leaves nothing: rejection then has probability 0 in exact arithmetic;
        # fall back to p_t so rounding can never hand the race an all-zero row.
        residual_ok = residual.sum(dim=-1, keepdim=True) > 0  # [batch, 1]
        use_residual = rejected[:, None] & residual_ok  # [batch, 1]
        final_probs = torch.where(use_residual, residual, final_probs)  # [batch, V]
    final_random = sample_with_noise(final_probs, noise)  # [batch]
    return torch.where(is_greedy, target_argmax[final_rows], final_random)


def rejection_sample(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    is_greedy: torch.Tensor,
    generators: list[torch.Generator | None],
    target_argmax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verifies a batch of draft tokens against the target model (see the module docstring).

    Args:
        draft_token_ids: [num_draft_tokens] int64, the drafts of all requests concatenated.
        num_draft_tokens: ``K_i >= 0`` per request; ``len(num_draft_tokens) == batch``.
        target_probs: [num_draft_tokens + batch, V] float. Request ``i`` owns ``K_i + 1``
            consecutive rows: one per draft position, then the bonus position. Already
            processed with the request's temperature / top-k / top-p.
        draft_probs: [num_draft_tokens, V] float, the proposer's distribution at each draft
            position, or None for a proposer without one (each draft is then a point mass).
        is_greedy: [batch] bool. Greedy requests use only each row's argmax (target_argmax).
        generators: per request, a generator (on ``target_probs``' device) for seeded
            requests, or None to use the default generator.
        target_argmax: [num_draft_tokens + batch] the greedy token of each row, taken from the
            logits (None: from ``target_probs``). The softmax can round two logits an ulp apart
            into a tie, or turn a row with an infinite logit into NaN: a greedy request
            verified beside a random one would then emit another token than plain greedy
            decoding, which takes the logits' argmax.

    Returns:
        output_token_ids: [batch, max_K + 1] int64, per request the accepted draft tokens then
            one recovered or bonus token, padded with ``PLACEHOLDER_TOKEN_ID``.
        num_accepted: [batch] int64, the number of accepted draft tokens (emitted = this + 1).
    """
    device = target_probs.device
    batch = len(num_draft_tokens)
    num_draft = sum(num_draft_tokens)
    vocab_size = target_probs.shape[-1]
    max_k = max(num_draft_tokens, default=0)
    if draft_token_ids.shape != (num_draft,):
        raise ValueError(
            f"draft_token_ids has shape {tuple(draft_token_ids.shape)}, expected ({num_draft},)"
        )
    if target_probs.shape != (num_draft + batch, vocab_size):
        raise ValueError(
            f"target_probs has shape {tuple(target_probs.shape)}, "
            f"expected ({num_draft + batch}, {vocab_size})"
        )
    if draft_probs is not None and draft_probs.shape != (num_draft, vocab_size):
        raise ValueError(
            f"draft_probs has shape {tuple(draft_probs.shape)}, "
            f"expected ({num_draft}, {vocab_size})"
        )
    if len(generators) != batch or is_greedy.shape != (batch,):
        raise ValueError("is_greedy and generators must have one entry per request")
    is_greedy = is_greedy.to(device)
    draft_token_ids = draft_token_ids.to(device=device, dtype=torch.long)

    # ---- Layout: flat draft index t -> (request, position) and target row. ----
    k = torch.tensor(num_draft_tokens, device=device, dtype=torch.long)  # [batch]
    draft_starts = torch.cumsum(k, dim=0) - k  # [batch]
    target_starts = draft_starts + torch.arange(batch, device=device)  # [batch]
    req_of_token = torch.repeat_interleave(
        torch.arange(batch, device=device), k, output_size=num_draft
    )  # [num_draft]
    pos_of_token = torch.arange(num_draft, device=device) - draft_starts[req_of_token]
    target_row_of_token = torch.arange(num_draft, device=device) + req_of_token  # [num_draft]

    if target_argmax is None:
        target_argmax = argmax(target_probs)  # [num_draft + batch]
    target_argmax = target_argmax.to(device)
    accept_greedy = draft_token_ids == target_argmax[target_row_of_token]  # [num_draft]
    all_greedy = bool(is_greedy.all())
    # A greedy request never draws from its own generator (alone it would draw nothing).
    generators = [None if greedy else g
                  for g, greedy in zip(generators, is_greedy.tolist(), strict=True)]
    if all_greedy:
        # No randomness and no residual: drawing Exp(1) noise over the vocabulary alone cost
        # ~6 ms per step at batch 8, more than the verification saved.
        accepted = accept_greedy
    else:
        accepted = _accept_random(draft_token_ids, draft_probs, target_probs,
                                  target_row_of_token, num_draft_tokens, generators,
                                  is_greedy[req_of_token], accept_greedy)

    # ---- Pad to [batch, max_k]; a request keeps its longest all-accepted prefix. ----
    accepted_padded = torch.zeros(batch, max_k, device=device, dtype=torch.long)
    accepted_padded[req_of_token, pos_of_token] = accepted.long()  # pads stay 0 (rejected)
    draft_padded = torch.full((batch, max_k), PLACEHOLDER_TOKEN_ID, device=device, dtype=torch.long)
    draft_padded[req_of_token, pos_of_token] = draft_token_ids
    num_accepted = accepted_padded.cumprod(dim=-1).sum(dim=-1)  # [batch]

    # ---- One recovered (n < K) or bonus (n == K) token at position n = num_accepted. ----
    final_rows = target_starts + num_accepted  # [batch]
    if all_greedy:
        final_token = target_argmax[final_rows]
    else:
        final_token = _final_random(target_probs, draft_probs, draft_token_ids, final_rows,
                                    draft_starts, num_accepted, k, num_draft, generators,
                                    is_greedy, target_argmax)

    # ---- Assemble: accepted drafts, then the final token, then padding. ----
    output_token_ids = torch.full(
        (batch, max_k + 1), PLACEHOLDER_TOKEN_ID, device=device, dtype=torch.long
    )  # [batch, max_k + 1]
    positions = torch.arange(max_k, device=device)  # [max_k]
    keep = positions[None, :] < num_accepted[:, None]  # [batch, max_k]
    output_token_ids[:, :max_k] = torch.where(keep, draft_padded, PLACEHOLDER_TOKEN_ID)
    output_token_ids.scatter_(1, num_accepted[:, None], final_token[:, None])
    return output_token_ids, num_accepted
