"""The speculation cost model and the choice of K per request, as pure functions.

A forward's time is a function of how many tokens it carries: flat while the step is bound by
reading the weights, then linear once it is bound by compute (the knee). On top of that comes
attention over the context, which the token count does not see: every sequence reads its KV
cache once per step, and every query token computes scores against its whole context. Measured
on the embedded model (bf16, this CPU), a verification token at a 2.5k-token RAG context costs
~1.5 ms where one at a 200-token context costs ~0.5 ms; a token-count-only model mispredicted
steps by 30% on average and let drafts look equally cheap for both. So

    T(step) = scale * (T_lin(num_tokens) + kv_read_s * sum_seq ctx + attention_s * sum_tok ctx)

with ctx counted beyond the profile's own context (its cost is already inside T_lin).
`StepCostModel` holds T_lin as points profiled at start-up, the two context coefficients from
the same profile, a second curve for tokens that need no logits (prefill chunks, a draft's
catch-up), and nudges one scale factor toward every measured step.

Given per-request acceptance rates and contexts, `choose_num_speculative_tokens` picks K_i in
0..K_max_i to maximise the batch's expected goodput (tokens emitted per second):

    goodput(K) = sum_i E[emitted_i](K_i) / (T(N + sum_i K_i) + T_draft(K))
    E[emitted](K) = 1 + sum_{j<=K} prod_{m<=j} a_m

where a_m is the conditional acceptance of draft position m (acceptance.py); with one rate a
for all positions this is (1 - a^(K+1)) / (1 - a) (Leviathan et al. 2023, eq. 1). The j-th draft
token adds prod_{m<=j} a_m, which never grows with j, and a request's draft tokens all cost the
same, so for a fixed total S = sum K_i the best split takes the S increments with the largest
gain per second, gain / (marginal token time + attention_s * ctx_i). We sweep S over
0..sum K_max_i along that order and keep the best goodput: one sort and a few vector ops per step.
A draft network's cost is set by the depth of the drafts (chained forward j serves every request
with K_i >= j), not by their number, so for it the sweep runs once per depth D, over levels <= D.

A draft network (a draft model, an EAGLE head) must first catch up on every token it has not
seen: the prompt, or a long stretch during which the request did not speculate. That work is
paid once and then serves every later verification of the request, so the plan charges each
step a share of it: the catch-up's time divided by the verifications the request has left
(tokens left / tokens per verification). Charged to one step, it kept the EAGLE head off for
good on every prompt longer than ~100 tokens, where the static head gave 1.44-1.67x vanilla (a
request that never starts only falls further behind;
docs/results/2026-12-02-session11/catch_up_trap.txt).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

import numpy as np

SCALAR_MAX_REQS = 1  # 1: a batch of one is planned in plain Python (choose_for_one_request)
FEW_MAX_REQS = 16  # and a free proposer's batches up to this size too (_choose_few)


def beyond(contexts: np.ndarray, base: int) -> np.ndarray:
    """Context tokens past the profiled context (whose attention T_lin already contains)."""
    return np.maximum(np.asarray(contexts, dtype=np.float64) - base, 0.0)


def token_context_sum(start: int, num_tokens: int, base: int) -> float:
    """sum over positions p in [start, start + num_tokens) of max(p + 1 - base, 0): the context
    the query tokens of one scheduled run attend to, beyond the profiled context."""
    lo, hi = max(start + 1, base + 1), start + num_tokens
    return 0.0 if hi < lo else (hi - lo + 1) * ((lo + hi) / 2 - base)


def runs_context(runs: Iterable[tuple[int, int]], base: int) -> tuple[float, float]:
    """(sequence context, token context) of a forward over runs, (first position, tokens) per
    sequence, beyond the profiled context: what StepCostModel.context_time takes."""
    return (sum(max(start + n - base, 0) for start, n in runs),
            sum(token_context_sum(start, n, base) for start, n in runs))


def token_context_sums(starts: np.ndarray, nums: np.ndarray, base: int) -> np.ndarray:
    """token_context_sum over arrays of runs."""
    lo = np.maximum(starts + 1, base + 1)
    hi = starts + nums
    return np.where(hi < lo, 0.0, (hi - lo + 1) * ((lo + hi) / 2 - base))


class StepCostModel:
    """Seconds per forward as a piecewise-linear function of the number of tokens, plus the
    context terms above.

    The start-up profile fixes the curve's shape; online refinement learns one scale factor
    (an EMA of measured / predicted step time). Moving only the points next to each measured
    step instead raised T(8) under a decode batch of 8 while T(16) stayed put, flattening the
    slope and making drafts look free."""

    def __init__(self, num_tokens: list[int], seconds: list[float], ema: float = 0.05,
                 kv_read_s: float = 0.0, attention_s: float = 0.0, base_context: int = 0,
                 chunk: StepCostModel | None = None):
        order = np.argsort(num_tokens)
        self.x = np.asarray(num_tokens, dtype=np.float64)[order]
        self.y = np.asarray(seconds, dtype=np.float64)[order]
        self.y = np.maximum.accumulate(self.y)  # more tokens never cost less
        self._xs, self._ys = self.x.tolist(), self.y.tolist()
        self.ema = ema
        self.scale = 1.0
        self.kv_read_s = kv_read_s  # per sequence and context token: reading its KV cache
        self.attention_s = attention_s  # per query token and context token: scores and P V
        self.base_context = base_context  # the profile's context, inside T_lin already
        # One sequence of n tokens with logits for its last only: prices the tokens that need
        # no logits (prefill chunks, a draft's catch-up). Priced on the decode curve, logits
        # over rows that never compute them, a draft's 150-token catch-up came to 10.0 ms where
        # it takes 6.7, and steps with prefill chunks were predicted 60-77% off (json at 32,
        # rag at 8-16), dragging the scale down for the decode steps after them. Its own scale
        # stays 1: this model's scale moves both.
        self.chunk = chunk

    def __call__(self, num_tokens: np.ndarray | float) -> np.ndarray | float:
        """Scaled T_lin: the step's time without the context terms."""
        if not isinstance(num_tokens, np.ndarray):
            return self._scalar(float(num_tokens))
        n = np.asarray(num_tokens, dtype=np.float64)
        t = np.interp(n, self.x, self.y)
        # Past the last profiled point, extrapolate with the last slope (compute-bound).
        slope = (self.y[-1] - self.y[-2]) / (self.x[-1] - self.x[-2]) if len(self.x) > 1 else 0
        t = self.scale * np.where(n > self.x[-1], self.y[-1] + slope * (n - self.x[-1]), t)
        return np.where(n <= 0, 0.0, t) if t.ndim else (0.0 if n <= 0 else float(t))

    def _scalar(self, n: float) -> float:
        """__call__ for one number in plain Python: numpy's per-call overhead on scalars was
        ~15 us, several times per step."""
        if n <= 0:
            return 0.0
        x, y = self._xs, self._ys
        if n >= x[-1]:
            slope = (y[-1] - y[-2]) / (x[-1] - x[-2]) if len(x) > 1 else 0.0
            return self.scale * (y[-1] + slope * (n - x[-1]))
        i = bisect.bisect_right(x, n)
        if i == 0:
            return self.scale * y[0]
        f = (n - x[i - 1]) / (x[i] - x[i - 1])
        return self.scale * (y[i - 1] + f * (y[i] - y[i - 1]))

    def context_time(self, seq_context: float, token_context: float) -> float:
        """Scaled seconds of the context terms (contexts already counted beyond base_context)."""
        return self.scale * (self.kv_read_s * seq_context + self.attention_s * token_context)

    def predict(self, num_tokens: float, seq_context: float = 0.0, token_context: float = 0.0,
                num_without_logits: float = 0.0) -> float:
        """A step of num_tokens, of which num_without_logits need no logits (prefill chunks)."""
        rows = num_tokens - num_without_logits
        return float(self(rows)) + float(self.extra_tokens_time(rows, num_without_logits)) \
            + self.context_time(seq_context, token_context)

    def update(self, num_tokens: int, seconds: float, seq_context: float = 0.0,
               token_context: float = 0.0, num_without_logits: int = 0) -> float:
        """Move the scale toward a measured step (online refinement). Returns the step's time
        as predicted before the move."""
        predicted = self.predict(num_tokens, seq_context, token_context, num_without_logits)
        if num_tokens > 0 and seconds > 0:
            self._pull(seconds / max(predicted, 1e-9))
        return predicted

    def _pull(self, ratio: float) -> None:
        # Clip one step's pull: a step that waited on the OS must not swing the whole model.
        self.scale *= 1 + self.ema * (min(max(ratio, 0.5), 2.0) - 1)

    def extra_tokens_time(self, num_seqs, extra_tokens):
        """What extra_tokens more tokens add to a forward of num_seqs sequences x 1 token when
        they need no logits (prefill chunks, a draft's catch-up): on the chunk curve if there
        is one, else on this one."""
        if self.chunk is None:
            return self(num_seqs + extra_tokens) - self(num_seqs)
        return self.scale * (self.chunk(num_seqs + extra_tokens) - self.chunk(num_seqs))

    def forward_time(self, num_tokens: int, num_seqs: int) -> float:
        """A forward of num_seqs sequences carrying num_tokens tokens, logits for one row each."""
        return float(self(num_seqs)) + float(self.extra_tokens_time(num_seqs,
                                                                    num_tokens - num_seqs))

    def update_forwards(self, forwards: list[tuple[int, int, list[tuple[int, int]]]],
                        seconds: float) -> float:
        """Move the scale toward the measured time of several forwards, (tokens, sequences,
        runs) each (a proposal: a catch-up forward, then one token per sequence; runs: (first
        position, tokens) per sequence, whose context the attention read). Returns their time
        as predicted before the move."""
        predicted = sum(self.forward_time(t, n)
                        + self.context_time(*runs_context(runs, self.base_context))
                        for t, n, runs in forwards)
        if predicted > 0 and seconds > 0:
            self._pull(seconds / predicted)
        return predicted


def fit_knee_curve(num_tokens: list[int], seconds: list[float],
                   jumps: tuple[int, ...] = ()) -> list[float]:
    """The profile's points replaced by the best fit of a flat-then-linear curve with steps,

        T(n) = a + s1 * min(n, k) + s2 * max(n - k, 0) + sum_b J_b * [n > b],   s1, s2, J_b >= 0,

    with the knee k one of the profiled points and a step J_b allowed after each row count b in
    `jumps` (where kernels tile rows), least squares in relative error (the decisions live at
    small n, where the times are smallest), or of the same with a second knee (two_knee_bases)
    where that halves the error. Fitted at each point separately, one forward's noise
    left flat stretches: on this CPU one profile read T(3) = T(4) = T(6) where the slope is ~0.4
    ms per token, and the controller bought drafts there as if they were free (prose at
    concurrency 4: 0.93x off). Without the steps, the AMX linear's second pass over the weights
    (rows 33-64) read as 0.4 ms per token where the 33rd row alone costs 6 ms, and the controller
    bought a few drafts at concurrency 32 for 26% of a step (docs/performance.md, session 28). A
    step is fitted only where points lie on both sides of it; one the data does not show comes
    out 0."""
    x = np.asarray(num_tokens, dtype=np.float64)
    steps = step_columns(x, jumps)
    one = best_relative_fit(seconds, one_knee_bases(x, steps))
    two = best_relative_fit(seconds, two_knee_bases(x, steps))
    return two if relative_sse(two, seconds) < TWO_KNEE_GAIN * relative_sse(one, seconds) else one


# A second knee is kept only where it cuts the relative squared error at least this much: it
# can also bend around one slow or lucky point, and on the AMX Xeon's profiles (one knee, then
# a slope that falls after 16 rows) it cut the error by only ~20%.
TWO_KNEE_GAIN = 0.5


def one_knee_bases(x: np.ndarray, steps: list[np.ndarray]) -> Iterable[np.ndarray]:
    """Bases of T(n) = a + s1 * min(n, k) + s2 * max(n - k, 0) + steps, a knee k at each point."""
    for k in x:
        yield np.stack([np.ones_like(x), np.minimum(x, k), np.maximum(x - k, 0.0), *steps], axis=1)


def two_knee_bases(x: np.ndarray, steps: list[np.ndarray]) -> Iterable[np.ndarray]:
    """Bases of T(n) = a + s1 * min(n, k1) + s2 * clip(n - k1, 0, k2 - k1) + s3 * max(n - k2, 0)
    + steps, with s1 <= s2 (the curve steepens at the first knee, where the forward turns
    compute-bound) and s3 >= 0 free (kernels change regime later: the slope fell after 16 rows on
    the AMX Xeon and rose after 12 on a Zen 3). On a 2-core Zen 3 the forward costs ~+1 ms per
    token up to 2-4 tokens and ~3 from there to 12; one knee put the knee at 1 in 5 of 6 engines
    and priced the second token at +2.8 ms where it took +0.9-1.5 (docs/performance.md, session
    33). At least one profiled point lies strictly between the knees, so that the middle
    segment is a slope the data shows, not one point."""
    knees = np.unique(x)  # sorted: knees[i + 2:] leaves a profiled point between k1 and k2
    for i, k1 in enumerate(knees):
        for k2 in knees[i + 2:]:
            # s1 on every token up to k2, plus (s2 - s1) between the knees: every coefficient
            # past the intercept is >= 0, as best_relative_fit fits them.
            yield np.stack([np.ones_like(x), np.minimum(x, k2), np.clip(x - k1, 0.0, k2 - k1),
                            np.maximum(x - k2, 0.0), *steps], axis=1)


def relative_sse(fit, seconds) -> float:
    """Sum of squared relative errors of fitted values against the measured ones."""
    y = np.asarray(seconds, dtype=np.float64)
    return float(np.sum(((np.asarray(fit) - y) / np.maximum(y, 1e-12)) ** 2))


def step_columns(x: np.ndarray, jumps: tuple[int, ...]) -> list[np.ndarray]:
    """A [n > b] column for each row count b in jumps with points on both sides of it."""
    return [np.where(x > b, 1.0, 0.0) for b in jumps if (x <= b).any() and (x > b).any()]


def best_relative_fit(seconds, bases: Iterable[np.ndarray]) -> list[float]:
    """The points' best least-squares fit in relative error over candidate bases ([n, cols]:
    the intercept first, free; the other coefficients >= 0): the fitted values."""
    y = np.asarray(seconds, dtype=np.float64)
    w = 1.0 / np.maximum(y, 1e-12)
    best, best_err = y, np.inf
    for basis in bases:
        fit = basis @ _nonnegative_lstsq(basis * w[:, None], y * w)
        err = relative_sse(fit, y)
        if err < best_err:
            best, best_err = fit, err
    return best.tolist()


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin |a c - b| with c[1:] >= 0 (c[0], the intercept, free): refit without the most
    negative coefficient until none is left (a few columns; numpy has no NNLS)."""
    keep = list(range(a.shape[1]))
    while True:
        coef = np.zeros(a.shape[1])
        coef[keep] = np.linalg.lstsq(a[:, keep], b, rcond=None)[0]
        worst = min(keep[1:], key=lambda j: coef[j], default=None)
        if worst is None or coef[worst] >= 0:
            return coef
        keep.remove(worst)


def expected_emitted(alpha: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Expected tokens emitted by one verification of k drafts: 1 + alpha + ... + alpha^k."""
    alpha = np.clip(alpha, 0.0, 0.999999)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def level_gains(alphas: np.ndarray, depth: int) -> np.ndarray:
    """[num_reqs, depth]: the expected tokens the j-th draft adds, P(drafts 1..j all accepted).
    alphas: [num_reqs] one rate for every position, or [num_reqs, P] the conditional rate per
    position (positions past P reuse the last)."""
    a = np.clip(np.asarray(alphas, dtype=np.float64), 0.0, 0.999999)
    if a.ndim == 1:
        a = a[:, None]
    if a.shape[1] < depth:
        a = np.concatenate([a, np.repeat(a[:, -1:], depth - a.shape[1], axis=1)], axis=1)
    return np.cumprod(a[:, :depth], axis=1)


def choose_num_speculative_tokens(
    alphas: np.ndarray,  # [num_reqs] or [num_reqs, P] acceptance per request (level_gains)
    k_max: np.ndarray,  # [num_reqs] largest K allowed per request (0 = may not speculate)
    num_base_tokens: int,  # tokens the step carries anyway (1 per decode, plus prefill chunks)
    target_cost: StepCostModel,
    draft_cost=None,  # tokens -> seconds for one draft forward; None = free proposer (n-gram)
    catch_up: np.ndarray | None = None,  # [num_reqs] tokens the draft must first catch up on
    prev_total: int | None = None,  # sum K of the previous step, for hysteresis
    hysteresis: float = 0.02,
    min_gain: float = 0.03,
    contexts: np.ndarray | None = None,  # [num_reqs] context each request's next token sees
    num_prefill_tokens: int = 0,  # the part of num_base_tokens that is prefill chunks
    horizon: np.ndarray | None = None,  # [num_reqs] tokens each may still emit; None: one step
    num_emitted: float | None = None,  # tokens the step emits whatever the plan (emitted_anyway)
    other_context: float = 0.0,  # context (beyond base_context) of the requests not planned
) -> tuple[np.ndarray, float, float]:
    """Returns (K per request, predicted step seconds, predicted goodput in tokens/s).
    Prefill chunks in the step set the operating point (a step with a 300-token chunk is
    compute-bound, so drafts cost their full per-token time) but their time is left out of the
    goodput: it is spent whatever K is, and counting it made every draft look cheap next to a
    slow step — after each arrival the controller speculated at low acceptance and lost.
    Speculation must beat no speculation by min_gain (a margin for what the model leaves out);
    a new total must beat the previous step's by hysteresis, and the previous total is kept only
    while it still beats no speculation by min_gain / 2 (hysteresis never holds speculation on
    where it is predicted to lose). horizon spreads each request's catch-up over the verifications
    it has left (module docstring); the predicted step time counts the whole catch-up.
    other_context: the decoding requests the step carries but the plan does not decide for (a
    request's own `off` or `static`, grammar-forced drafts): their KV reads and attention are
    part of the step whatever the plan, and a draft's cost is weighed against the whole step."""
    num_reqs = len(alphas)
    if 0 < num_reqs <= SCALAR_MAX_REQS:
        k, time, goodput = choose_for_one_request(
            np.asarray(alphas, dtype=np.float64).reshape(-1).tolist(), int(np.max(k_max)),
            num_base_tokens, target_cost, draft_cost,
            1.0 if catch_up is None else float(catch_up[0]),
            None if horizon is None else float(horizon[0]), prev_total, hysteresis, min_gain,
            0.0 if contexts is None else float(contexts[0]), num_prefill_tokens, num_emitted,
            other_context)
        return np.array([k], dtype=np.int64), time, goodput
    k_max = np.asarray(k_max, dtype=np.int64)
    ctx = np.zeros(num_reqs) if contexts is None else beyond(contexts, target_cost.base_context)
    ctx_sum = float(ctx.sum()) + other_context
    prefill_time = float(target_cost.extra_tokens_time(num_base_tokens - num_prefill_tokens,
                                                       num_prefill_tokens))
    base_time = float(target_cost(num_base_tokens - num_prefill_tokens)) \
        + target_cost.context_time(ctx_sum, ctx_sum)
    base_tokens = emitted_anyway(num_emitted, num_reqs)
    none = (np.zeros(num_reqs, dtype=np.int64), base_time + prefill_time,
            base_tokens / max(base_time, 1e-9))
    if num_reqs == 0 or k_max.max(initial=0) == 0:
        return none
    if draft_cost is None and num_reqs <= FEW_MAX_REQS:
        k, time, goodput = _choose_few(
            np.asarray(alphas, dtype=np.float64).reshape(num_reqs, -1).tolist(), k_max.tolist(),
            num_base_tokens, target_cost, prev_total, hysteresis, min_gain, ctx.tolist(),
            base_time, base_tokens)
        return np.array(k, dtype=np.int64), time + prefill_time, goodput
    # Early exit, the common case under load: the most tokens any plan could yield (every
    # draft made), over the least time any plan could take, cannot clear the margin, so the
    # full search below would pick 0 too (hysteresis only acts on a plan that clears it). The
    # cheapest plan drafts one token: one more target token, at the least attention time among
    # the requests that may draft, and one draft forward. Nothing cheaper exists because the
    # target and draft curves never fall, attention costs >= 0, and a catch-up's share only
    # lowers a catch-up this bound does not count. Saves ~0.2 ms per step at batch 64; with
    # the target's extra token counted it also answers most plans of prose at 4 requests,
    # where n-gram guesses exist but are rarely right.
    attn_s = target_cost.context_time(0.0, 1.0)  # one query token's attention per context token
    depth = int(k_max.max())
    gains = level_gains(alphas, depth)  # [num_reqs, depth]
    levels = np.arange(1, depth + 1)
    allowed = levels[None, :] <= k_max[:, None]
    most_extra = float(gains[allowed].sum())
    least_time = base_time + target_cost(num_base_tokens + 1) - target_cost(num_base_tokens) \
        + attn_s * float(ctx[k_max > 0].min()) \
        + (float(draft_cost(1)) if draft_cost is not None else 0.0)
    if _no_plan_can_pay(base_tokens + most_extra, least_time, none[2], min_gain):
        return none
    # Every possible increment (request i, level j = 1..k_max_i) with its marginal gain and the
    # attention time its token adds; taken in order of gain per second.
    req_idx, level = np.nonzero(allowed)
    gain = gains[req_idx, level]
    level = level + 1
    attn = attn_s * ctx[req_idx]
    # The draft's own attention: each of its forwards reads the request's context too (a
    # trained draft's forwards over 16 rag requests took 1.5-3.3x a prediction without it).
    dctx = np.zeros(num_reqs) if draft_cost is None or contexts is None else \
        beyond(contexts, draft_cost.base_context)
    dattn = np.zeros(len(req_idx)) if draft_cost is None else \
        draft_cost.context_time(dctx[req_idx], dctx[req_idx])
    token_s = max((float(target_cost(num_base_tokens + 16)) - float(target_cost(num_base_tokens)))
                  / 16, 1e-9)  # marginal time of one more token, context aside
    order = np.lexsort((level, -gain / (token_s + attn + dattn)))  # a request's levels in order
    req_idx, level, gain, attn, dattn = (req_idx[order], level[order], gain[order], attn[order],
                                         dattn[order])
    # A draft network's chained forward j serves every request with K >= j at about the price
    # of one: the depth of the drafts, not their number, sets the draft's cost. Taken in order
    # of gain per target-second alone, the levels 3-4 of the best request came before level 1 of
    # the next, each a whole new forward, so the sweep never saw "K = 2 for both" (trained
    # draft, json, concurrency 2: K = 0 at 0.77x static K = 2). So the sweep runs once per
    # depth D, over the levels <= D only, and keeps the best plan of any depth: row d of the
    # arrays below is depth d + 1, column p the first p increments of the order, of which
    # those deeper than D are skipped (a skipped one repeats the previous plan). A free
    # proposer (n-gram) needs only the one row over every level.
    depths = levels[:, None] if draft_cost is not None else np.array([[depth]])
    take = level[None, :] <= depths  # [rows, M]

    def upto(x: np.ndarray) -> np.ndarray:  # [rows, M + 1]: sums over the first p taken
        return np.concatenate([np.zeros((len(depths), 1)),
                               np.cumsum(np.where(take, x[None, :], 0.0), axis=1)], axis=1)

    total = upto(np.ones(len(gain)))  # S, the drafts taken
    tokens = base_tokens + upto(gain)
    time = base_time - float(target_cost(num_base_tokens)) + target_cost(num_base_tokens + total) \
        + upto(attn)
    charged = time
    if draft_cost is not None:
        # Draft forward j runs over the requests whose K >= j (the same in every row that goes
        # that deep); forward 1 also catches up.
        width = np.concatenate([np.zeros((len(levels), 1)), np.cumsum(
            level[None, :] == levels[:, None], axis=1)], axis=1)  # [depth, M + 1]
        time = time + np.cumsum(draft_cost(width), axis=0) + upto(dattn)  # row d: 1..d + 1
        charged = time
        if catch_up is not None:
            extra = np.maximum(np.asarray(catch_up, dtype=np.float64) - 1, 0.0)
            share = catch_up_share(gains, allowed, horizon)
            first = level == 1
            extra_s = np.concatenate([[0.0], np.cumsum(np.where(first, extra[req_idx], 0.0))])
            paid_s = np.concatenate([[0.0], np.cumsum(np.where(
                first, extra[req_idx] * share[req_idx], 0.0))])
            catch_up_s = draft_cost.extra_tokens_time(width[0], extra_s)
            # the caught-up tokens' attention, each over the context before it
            raw = np.zeros(num_reqs) if contexts is None else np.asarray(contexts, np.float64)
            extra_ctx = draft_cost.context_time(0.0, token_context_sums(
                raw - extra - 1, extra, draft_cost.base_context))[req_idx]
            ctx_s = np.concatenate([[0.0], np.cumsum(np.where(first, extra_ctx, 0.0))])
            ctx_paid = np.concatenate([[0.0], np.cumsum(np.where(
                first, extra_ctx * share[req_idx], 0.0))])
            time = time + catch_up_s + ctx_s
            charged = charged + catch_up_s * paid_s / np.maximum(extra_s, 1e-9) + ctx_paid
    goodput = tokens / np.maximum(charged, 1e-9)
    row, best = np.unravel_index(int(np.argmax(goodput)), goodput.shape)  # the first maximum
    none_goodput = goodput[0, 0]
    if goodput[row, best] < (1 + min_gain) * none_goodput:
        row, best = 0, 0  # never keep speculating on a predicted gain inside the model's error
    elif prev_total is not None and 0 < prev_total:
        # Not worth switching: keeps K from flip-flopping near break-even. The previous total
        # is kept at whichever depth serves it best.
        at_prev = total == prev_total
        if at_prev.any():
            prev_goodput = np.where(at_prev, goodput, -np.inf)
            r, p = np.unravel_index(int(np.argmax(prev_goodput)), goodput.shape)
            if prev_goodput[r, p] >= (1 - hysteresis) * goodput[row, best] and \
                    prev_goodput[r, p] >= (1 + min_gain / 2) * none_goodput:
                row, best = r, p
    chosen = req_idx[:best][take[row, :best]]
    k = np.bincount(chosen, minlength=num_reqs)
    return k, float(time[row, best]) + prefill_time, float(goodput[row, best])


def emitted_anyway(num_emitted: float | None, num_planned: int) -> float:
    """Tokens the step emits whatever the plan: one per decoding request, the planned ones and
    the others (forced off or static, seeded sampled ones), and grammar-forced drafts (counted
    as accepted; a static request's drafts are not counted, being uncertain). The gain of a
    draft is measured against all of them, as its cost is against the whole step: counting only
    the planned requests' tokens made one planned request among seven others see a 1.25x gain
    where the batch lost (0.998x). None: the planned requests' own tokens."""
    return float(num_planned if num_emitted is None else max(num_emitted, num_planned))


def _no_plan_can_pay(most_tokens: float, least_time: float, none_goodput: float,
                     min_gain: float) -> bool:
    """The early exit's test: the most tokens any plan could yield, over the least time any plan
    could take, stays under the goodput a plan must reach to be chosen at all."""
    return most_tokens / least_time < (1 + min_gain) * none_goodput


def catch_up_share(gains: np.ndarray, allowed: np.ndarray,
                   horizon: np.ndarray | None) -> np.ndarray:
    """[num_reqs] the share of each request's catch-up charged to one step: one over the
    verifications it has left, counted at K_max's tokens per verification (the most, so the
    fewest verifications: the larger share); all of it without a horizon."""
    if horizon is None:
        return np.ones(len(gains))
    per_verification = 1.0 + np.where(allowed, gains, 0.0).sum(axis=1)
    return np.minimum(per_verification / np.maximum(np.asarray(horizon, dtype=np.float64), 1.0),
                      1.0)


def _best_prefix(goodput: list[float], prev_total: int | None, hysteresis: float,
                 min_gain: float) -> int:
    """The plain-Python plans' choice among the prefixes of their increments (goodput[p]: the
    first p taken), with the vector form's rules: the first maximum, none inside min_gain of
    no speculation, the previous total kept within hysteresis."""
    best = max(range(len(goodput)), key=goodput.__getitem__)  # the first maximum, as argmax
    if goodput[best] < (1 + min_gain) * goodput[0]:
        return 0
    if prev_total is not None and 0 < prev_total < len(goodput) and \
            goodput[prev_total] >= (1 - hysteresis) * goodput[best] and \
            goodput[prev_total] >= (1 + min_gain / 2) * goodput[0]:
        return prev_total
    return best


def choose_for_one_request(
    rates: list[float], k_max: int, num_base_tokens: int, target_cost: StepCostModel,
    draft_cost=None, catch_up: float = 1.0, horizon: float | None = None,
    prev_total: int | None = None, hysteresis: float = 0.02, min_gain: float = 0.03,
    context: float = 0.0, num_prefill_tokens: int = 0, num_emitted: float | None = None,
    other_context: float = 0.0,
) -> tuple[int, float, float]:
    """choose_num_speculative_tokens for a batch of one, from plain numbers: (K, predicted step
    seconds, goodput). A request running alone is planned at every step, right after a forward
    has left the CPU's caches cold, where the vector function took 58 us of a 148 us plan, ~35
    of them its prologue's numpy calls on arrays of one (2-core Zen 5, self-draft at
    concurrency 1; docs/results/2026-12-06-session41/plan_time_c1.txt)."""
    ctx = max(float(context) - target_cost.base_context, 0.0)
    draft_ctx = catch_up_ctx = 0.0
    if draft_cost is not None:
        draft_ctx = max(float(context) - draft_cost.base_context, 0.0)
        extra = max(catch_up - 1, 0.0)  # caught-up tokens before the last, over their contexts
        catch_up_ctx = token_context_sum(context - extra - 1, extra, draft_cost.base_context)
    prefill_time = float(target_cost.extra_tokens_time(num_base_tokens - num_prefill_tokens,
                                                       num_prefill_tokens))
    base_time = float(target_cost(num_base_tokens - num_prefill_tokens)) \
        + target_cost.context_time(ctx + other_context, ctx + other_context)
    base_tokens = emitted_anyway(num_emitted, 1)
    if k_max <= 0:
        return 0, base_time + prefill_time, base_tokens / max(base_time, 1e-9)
    k, time, goodput = _choose_one(rates, k_max, num_base_tokens, target_cost, draft_cost,
                                   catch_up, horizon, prev_total, hysteresis, min_gain, ctx,
                                   base_time, draft_ctx, catch_up_ctx, base_tokens)
    return k, time + prefill_time, goodput


def _choose_one(rates: list[float], k_max: int, num_base_tokens: int,
                target_cost: StepCostModel, draft_cost, catch_up: float,
                horizon: float | None, prev_total: int | None, hysteresis: float,
                min_gain: float, ctx: float, base_time: float, draft_ctx: float = 0.0,
                catch_up_ctx: float = 0.0, base_tokens: float = 1.0) -> tuple[int, float, float]:
    """choose_num_speculative_tokens for one request, in plain Python (K, predicted step time
    without prefill, goodput): the same goodput curve, whose increments are the request's levels
    in order. At concurrency 1 the vector form's ~40 numpy calls cost ~0.2 ms per plan, 2% of a
    step, for a choice among five numbers."""
    t_base = target_cost(num_base_tokens)
    attn = target_cost.context_time(0.0, 1.0) * ctx
    reach = [1.0]  # reach[k]: P(drafts 1..k right), the tokens the k-th draft adds
    for k in range(1, k_max + 1):
        reach.append(reach[-1] * min(max(rates[min(k, len(rates)) - 1], 0.0), 0.999999))
    catch_up_s, share, draft_s = 0.0, 1.0, 0.0
    if draft_cost is not None:  # a forward's time, its attention over the context included
        draft_s = float(draft_cost(1)) + draft_cost.context_time(draft_ctx, draft_ctx)
    if draft_cost is not None and catch_up > 1:
        catch_up_s = float(draft_cost.extra_tokens_time(1, catch_up - 1)) \
            + draft_cost.context_time(0.0, catch_up_ctx)
        if horizon is not None:  # catch_up_share for one request
            share = min(sum(reach) / max(horizon, 1.0), 1.0)
    tokens, time = base_tokens, base_time
    goodput = [tokens / max(time, 1e-9)]
    times = [time]
    for k in range(1, k_max + 1):
        tokens += reach[k]
        time = base_time - t_base + target_cost(num_base_tokens + k) + attn * k
        charged = time
        if draft_cost is not None:  # forward 1 also catches up; each later one is one token
            time += k * draft_s + catch_up_s
            charged = time - (1 - share) * catch_up_s
        goodput.append(tokens / max(charged, 1e-9))
        times.append(time)
    best = _best_prefix(goodput, prev_total, hysteresis, min_gain)
    return best, times[best], goodput[best]


def _choose_few(rates: list[list[float]], k_max: list[int], num_base_tokens: int,
                target_cost: StepCostModel, prev_total: int | None, hysteresis: float,
                min_gain: float, ctx: list[float], base_time: float,
                base_tokens: float | None = None) -> tuple[list[int], float, float]:
    """choose_num_speculative_tokens for a few requests and a free proposer (n-gram), in plain
    Python: the vector form's single sweep (increments in order of gain per second, the best
    prefix), and its answer. Between two forwards of a small batch the vector form took
    ~170-190 us a plan on a 2-core Zen 5 (the forward leaves the CPU's caches cold for numpy's
    ~40 calls): 1.3% of a 14 ms step at concurrency 8, where n-gram guesses exist at nearly
    every step on prose but rarely pay."""
    t_base = target_cost(num_base_tokens)
    attn_s = target_cost.context_time(0.0, 1.0)
    token_s = max((target_cost(num_base_tokens + 16) - t_base) / 16, 1e-9)
    increments = []  # (-gain per second, level, request, gain, attention), vector order
    for i, (row, k) in enumerate(zip(rates, k_max, strict=True)):
        reach = 1.0
        for j in range(k):
            reach *= min(max(row[min(j, len(row) - 1)], 0.0), 0.999999)
            increments.append((-reach / (token_s + attn_s * ctx[i]), j + 1, i, reach,
                               attn_s * ctx[i]))
    increments.sort(key=lambda inc: inc[:2])  # stable, as the vector form's lexsort
    tokens, attn = float(len(rates)) if base_tokens is None else base_tokens, 0.0
    goodput, times = [tokens / max(base_time, 1e-9)], [base_time]
    for p, (_, _, _, gain, a) in enumerate(increments, start=1):
        tokens += gain
        attn += a
        times.append(base_time - t_base + target_cost(num_base_tokens + p) + attn)
        goodput.append(tokens / max(times[-1], 1e-9))
    best = _best_prefix(goodput, prev_total, hysteresis, min_gain)
    ks = [0] * len(rates)
    for inc in increments[:best]:
        ks[inc[2]] += 1
    return ks, times[best], goodput[best]
