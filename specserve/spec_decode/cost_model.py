"""The speculation cost model and the choice of K per request, as pure functions.

A forward's time is a function of how many tokens it carries: flat while the step is bound by
reading the weights, then linear once it is bound by compute (the knee). `StepCostModel` holds
that curve as points profiled at start-up and nudges them toward every measured step.

Given per-request acceptance rates alpha_i, `choose_num_speculative_tokens` picks K_i in
0..K_max_i to maximise the batch's expected goodput (tokens emitted per second):

    goodput(K) = sum_i E[emitted_i](K_i) / (T_target(N + sum_i K_i) + T_draft(K))
    E[emitted](K) = (1 - alpha^(K+1)) / (1 - alpha)      (Leviathan et al. 2023, eq. 1)

E[emitted] is concave in K (the j-th draft token adds alpha^j), so for a fixed total S = sum K_i
the best split takes the S largest marginal gains alpha_i^j over all requests. We sweep S over
0..sum K_max_i along that order and keep the best goodput: one sort and a few vector ops per step.
"""

from __future__ import annotations

import numpy as np


class StepCostModel:
    """Seconds per forward as a piecewise-linear function of the number of tokens.

    The start-up profile fixes the curve's shape; online refinement learns one scale factor
    (an EMA of measured / predicted step time). Real steps cost more than the profile's (longer
    contexts, sampling, prefill chunks) by a roughly constant factor; moving only the points next
    to each measured step instead raised T(8) under a decode batch of 8 while T(16) stayed put,
    flattening the slope and making drafts look free."""

    def __init__(self, num_tokens: list[int], seconds: list[float], ema: float = 0.05):
        order = np.argsort(num_tokens)
        self.x = np.asarray(num_tokens, dtype=np.float64)[order]
        self.y = np.asarray(seconds, dtype=np.float64)[order]
        self.y = np.maximum.accumulate(self.y)  # more tokens never cost less
        self.ema = ema
        self.scale = 1.0

    def __call__(self, num_tokens: np.ndarray | float) -> np.ndarray | float:
        n = np.asarray(num_tokens, dtype=np.float64)
        t = np.interp(n, self.x, self.y)
        # Past the last profiled point, extrapolate with the last slope (compute-bound).
        slope = (self.y[-1] - self.y[-2]) / (self.x[-1] - self.x[-2]) if len(self.x) > 1 else 0
        t = self.scale * np.where(n > self.x[-1], self.y[-1] + slope * (n - self.x[-1]), t)
        return np.where(n <= 0, 0.0, t) if t.ndim else (0.0 if n <= 0 else float(t))

    def update(self, num_tokens: int, seconds: float) -> None:
        """Move the scale toward a measured step (online refinement)."""
        if num_tokens <= 0 or seconds <= 0:
            return
        ratio = seconds / max(float(self(num_tokens)), 1e-9)
        # Clip one step's pull: a step that waited on the OS must not swing the whole model.
        self.scale *= 1 + self.ema * (min(max(ratio, 0.5), 2.0) - 1)


def expected_emitted(alpha: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Expected tokens emitted by one verification of k drafts: 1 + alpha + ... + alpha^k."""
    alpha = np.clip(alpha, 0.0, 0.999999)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def choose_num_speculative_tokens(
    alphas: np.ndarray,  # [num_reqs] acceptance estimate per request
    k_max: np.ndarray,  # [num_reqs] largest K allowed per request (0 = may not speculate)
    num_base_tokens: int,  # tokens the step carries anyway (1 per decode, plus prefill chunks)
    target_cost,  # tokens -> seconds
    draft_cost=None,  # tokens -> seconds for one draft forward; None = free proposer (n-gram)
    catch_up: np.ndarray | None = None,  # [num_reqs] tokens the draft must first catch up on
    prev_total: int | None = None,  # sum K of the previous step, for hysteresis
    hysteresis: float = 0.02,
    min_gain: float = 0.03,
) -> tuple[np.ndarray, float, float]:
    """Returns (K per request, predicted step seconds, predicted goodput in tokens/s).
    Speculation must beat no speculation by min_gain (a margin for what the model leaves out);
    a new total must beat the previous step's by hysteresis, and the previous total is kept only
    while it still beats no speculation by min_gain / 2 (hysteresis never holds speculation on
    where it is predicted to lose)."""
    num_reqs = len(alphas)
    alphas = np.clip(np.asarray(alphas, dtype=np.float64), 0.0, 0.999999)
    k_max = np.asarray(k_max, dtype=np.int64)
    base_time = float(target_cost(num_base_tokens))
    base_tokens = float(num_reqs)
    none = np.zeros(num_reqs, dtype=np.int64), base_time, base_tokens / max(base_time, 1e-9)
    if num_reqs == 0 or k_max.max(initial=0) == 0:
        return none
    # Early exit, the common case under load: even if every draft token cost nothing beyond one
    # draft forward, the expected extra tokens could not clear the margin (the full search
    # below would also pick 0, hysteresis included). Saves ~0.2 ms per step at batch 64.
    most_extra = float((expected_emitted(alphas, k_max) - 1).sum())
    least_time = base_time + (float(draft_cost(1)) if draft_cost is not None else 0.0)
    if (base_tokens + most_extra) / least_time < (1 + min_gain / 2) * none[2]:
        return none
    # Every possible increment (request i, level j = 1..k_max_i) with its marginal gain alpha^j.
    levels = np.arange(1, int(k_max.max()) + 1)
    req_idx, level = np.nonzero(levels[None, :] <= k_max[:, None])
    level = level + 1
    gain = alphas[req_idx] ** level
    order = np.lexsort((level, -gain))  # largest gain first; a request's levels stay in order
    req_idx, level, gain = req_idx[order], level[order], gain[order]
    total = np.arange(len(gain) + 1)  # S = number of increments taken
    tokens = base_tokens + np.concatenate([[0.0], np.cumsum(gain)])
    time = target_cost(num_base_tokens + total)
    if draft_cost is not None:
        # Draft forward j runs over the requests whose K >= j; forward 1 also catches up.
        width = np.zeros((len(levels), len(total)))
        first = np.ones(num_reqs) if catch_up is None else np.maximum(catch_up, 1)
        for j in levels:
            add = np.where(level == j, first[req_idx] if j == 1 else 1.0, 0.0)
            width[j - 1] = np.concatenate([[0.0], np.cumsum(add)])
        time = time + draft_cost(width).sum(axis=0)
    goodput = tokens / np.maximum(time, 1e-9)
    best = int(np.argmax(goodput))
    if goodput[best] < (1 + min_gain) * goodput[0]:
        best = 0  # never keep speculating on a predicted gain inside the model's error
    elif prev_total is not None and 0 < prev_total < len(goodput) and \
            goodput[prev_total] >= (1 - hysteresis) * goodput[best] and \
            goodput[prev_total] >= (1 + min_gain / 2) * goodput[0]:
        best = prev_total  # not worth switching: avoids K flip-flopping near break-even
    k = np.bincount(req_idx[:best], minlength=num_reqs)
    return k, float(time[best]), float(goodput[best])
