"""Tests for the lossless rejection sampler (specserve/sample/rejection_sampler.py).

The statistical tests draw large batches with fixed seeds, so they are deterministic. Each
goodness-of-fit check is a Pearson chi-square test at ALPHA = 1e-3; with the 17 such checks
below, a correct sampler would fail one of them for a fresh seed with probability at most
1.7% (Bonferroni), and the negative controls show the same checks reject realistic bugs with
p-values many orders of magnitude below ALPHA.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import pytest
import torch

from specserve.sample.rejection_sampler import (
    PLACEHOLDER_TOKEN_ID,
    rejection_sample,
    sample_from_probs,
)

ALPHA = 1e-3  # significance level of every chi-square goodness-of-fit check
P = PLACEHOLDER_TOKEN_ID


# --------------------------------------------------------------------------------------------
# Chi-square goodness of fit, without scipy.
# --------------------------------------------------------------------------------------------


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X ~ chi-square(df), i.e. the regularised upper incomplete gamma
    Q(df/2, x/2). Exact for integer df, via Q(a + 1, y) = Q(a, y) + y^a e^-y / Gamma(a + 1)
    starting from Q(1/2, y) = erfc(sqrt(y)) (odd df) or Q(1, y) = e^-y (even df)."""
    if x <= 0:
        return 1.0
    y = x / 2
    a, q = (0.5, math.erfc(math.sqrt(y))) if df % 2 else (1.0, math.exp(-y))
    while a < df / 2:
        q += math.exp(a * math.log(y) - y - math.lgamma(a + 1))
        a += 1
    return q


@dataclass
class FitResult:
    statistic: float  # Pearson chi-square over the categories with positive expected probability
    df: int
    impossible: int  # samples that landed on a zero-probability category
    num_samples: int

    @property
    def chi2_pvalue(self) -> float:
        return chi2_sf(self.statistic, self.df)

    @property
    def pvalue(self) -> float:
        """Overall p-value: any sample of a zero-probability token is conclusive evidence."""
        return 0.0 if self.impossible else self.chi2_pvalue


def goodness_of_fit(tokens: torch.Tensor, probs: torch.Tensor) -> FitResult:
    """Compares the empirical distribution of ``tokens`` with ``probs`` [V]."""
    probs = probs.double() / probs.double().sum()
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    n = tokens.numel()
    support = probs > 0
    expected = n * probs[support]
    assert expected.min() >= 5, "chi-square approximation needs >= 5 expected per category"
    statistic = ((counts[support] - expected) ** 2 / expected).sum().item()
    return FitResult(
        statistic=statistic,
        df=int(support.sum()) - 1,
        impossible=int(counts[~support].sum()),
        num_samples=n,
    )


def assert_fits(tokens: torch.Tensor, probs: torch.Tensor) -> None:
    fit = goodness_of_fit(tokens, probs)
    assert fit.impossible == 0, f"{fit.impossible} samples of zero-probability tokens"
    assert fit.chi2_pvalue > ALPHA, (
        f"chi-square {fit.statistic:.1f} (df={fit.df}), "
        f"p={fit.chi2_pvalue:.2e} on {fit.num_samples} samples"
    )


@pytest.mark.parametrize(
    ("x", "df", "p"),
    # Textbook critical values of the chi-square distribution.
    [
        (3.841, 1, 0.05),
        (6.635, 1, 0.01),
        (18.307, 10, 0.05),
        (16.919, 9, 0.05),
        (27.877, 9, 0.001),
        (31.264, 11, 0.001),
        (32.909, 12, 0.001),
    ],
)
def test_chi2_sf_matches_tables(x: float, df: int, p: float) -> None:
    assert chi2_sf(x, df) == pytest.approx(p, rel=2e-3)


# --------------------------------------------------------------------------------------------
# Helpers to build batches.
# --------------------------------------------------------------------------------------------


def probs_with_argmax(argmaxes: list[int], vocab_size: int, seed: int = 0) -> torch.Tensor:
    """Arbitrary probability rows whose argmax is the given token."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.rand(len(argmaxes), vocab_size, generator=g) * 0.5
    rows[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 1.0
    return rows / rows.sum(-1, keepdim=True)


def run_greedy(
    drafts: list[list[int]], target_argmax: list[list[int]], vocab_size: int = 10
) -> tuple[torch.Tensor, torch.Tensor]:
    assert all(len(t) == len(d) + 1 for d, t in zip(drafts, target_argmax, strict=True))
    flat_drafts = [x for d in drafts for x in d]
    target = probs_with_argmax([x for t in target_argmax for x in t], vocab_size)
    # Greedy requests must ignore the draft distribution entirely.
    draft_probs = torch.rand(len(flat_drafts), vocab_size).softmax(-1)
    return rejection_sample(
        torch.tensor(flat_drafts, dtype=torch.long),
        [len(d) for d in drafts],
        target,
        draft_probs,
        torch.ones(len(drafts), dtype=torch.bool),
        [None] * len(drafts),
    )


# --------------------------------------------------------------------------------------------
# 1. Greedy.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("draft", "argmax", "expected", "accepted"),
    [
        ([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4], 3),  # all accepted + bonus
        ([1, 2, 3], [5, 2, 3, 4], [5, P, P, P], 0),  # first rejected -> recovered argmax
        ([1, 2, 3], [1, 6, 3, 4], [1, 6, P, P], 1),  # mid rejected (later matches don't count)
        ([1, 2, 3], [1, 2, 9, 4], [1, 2, 9, P], 2),  # last rejected
        ([], [7], [7], 0),  # K = 0: just the target argmax
    ],
)
def test_greedy_single(
    draft: list[int], argmax: list[int], expected: list[int], accepted: int
) -> None:
    out, num_accepted = run_greedy([draft], [argmax])
    assert out.tolist() == [expected]
    assert num_accepted.tolist() == [accepted]
    assert out.dtype == torch.long and num_accepted.dtype == torch.long


def test_greedy_mixed_batch() -> None:
    drafts = [[1, 2, 3], [], [4, 4], [1, 2, 3], [8], []]
    argmax = [[1, 2, 3, 0], [7], [4, 5, 6], [5, 2, 3, 4], [8, 9], [3]]
    out, num_accepted = run_greedy(drafts, argmax)
    assert out.tolist() == [
        [1, 2, 3, 0],
        [7, P, P, P],
        [4, 5, P, P],
        [5, P, P, P],
        [8, 9, P, P],
        [3, P, P, P],
    ]
    assert num_accepted.tolist() == [3, 0, 1, 0, 1, 0]


def test_all_requests_without_drafts() -> None:
    target = probs_with_argmax([2, 5], vocab_size=6)
    for draft_probs in (None, torch.empty(0, 6)):
        out, num_accepted = rejection_sample(
            torch.empty(0, dtype=torch.long),
            [0, 0],
            target,
            draft_probs,
            torch.tensor([True, False]),
            [None, torch.Generator().manual_seed(0)],
        )
        assert out.shape == (2, 1)
        assert out[0].item() == 2 and 0 <= out[1].item() < 6
        assert num_accepted.tolist() == [0, 0]


def test_identical_draft_and_target_accepts_everything() -> None:
    g = torch.Generator().manual_seed(0)
    k = [4, 2, 3]
    target = torch.rand(sum(k) + 3, 16, generator=g).softmax(-1)
    draft_rows = torch.cat([torch.arange(s, s + n) for s, n in zip([0, 5, 8], k, strict=True)])
    draft_probs = target[draft_rows]
    drafts = torch.multinomial(draft_probs, 1, generator=g).squeeze(-1)
    out, num_accepted = rejection_sample(
        drafts, k, target, draft_probs, torch.zeros(3, dtype=torch.bool), [None] * 3
    )
    assert num_accepted.tolist() == k
    assert out[0, :4].tolist() == drafts[:4].tolist()


def test_zero_residual_falls_back_to_target() -> None:
    # p_t == p_d and both are 0 at the draft token: it is rejected (ratio 0/0 counts as a
    # rejection), the residual max(p_t - p_d, 0) is all zero, so recover from p_t instead.
    probs = torch.tensor([0.0, 0.5, 0.5, 0.0])
    n = 200
    out, num_accepted = rejection_sample(
        torch.zeros(n, dtype=torch.long),
        [1] * n,
        probs.repeat(2 * n, 1),
        probs.repeat(n, 1),
        torch.zeros(n, dtype=torch.bool),
        [None] * n,
    )
    assert num_accepted.eq(0).all()
    assert set(out[:, 0].tolist()) == {1, 2}
    assert out[:, 1].eq(P).all()


# --------------------------------------------------------------------------------------------
# 2. Losslessness: emitted tokens follow the target distribution.
# --------------------------------------------------------------------------------------------

VOCAB = 12
KS = (0, 1, 2, 3)  # draft lengths, mixed within one batch
REQUESTS_PER_K = 12_000  # 48,000 requests, 72,000 draft tokens


@functools.cache
def distributions() -> tuple[torch.Tensor, torch.Tensor]:
    """Target distributions P[j] for positions j = 0..3 and draft distributions Q[j] for
    j = 0..2, each with a dominant token (a different one per position) so that acceptance is
    realistic. Token 0 has target probability 0 but draft mass (always rejected); token 1 has
    draft probability 0 but target mass (reachable only through recovery)."""
    g = torch.Generator().manual_seed(2023)
    dominant = torch.tensor([3, 7, 5, 9])
    p = torch.rand(len(KS), VOCAB, generator=g) + 0.5
    p[:, 0] = 0.0
    p = 0.5 * p / p.sum(-1, keepdim=True)
    p[torch.arange(len(KS)), dominant] += 0.5
    q = torch.rand(len(KS) - 1, VOCAB, generator=g) ** 2 + 0.05
    q[:, 1] = 0.0
    q = 0.7 * q / q.sum(-1, keepdim=True)
    q[torch.arange(len(KS) - 1), dominant[:-1]] += 0.3
    return p, q


def point_mass_proposals() -> torch.Tensor:
    """For the proposer without a distribution: the law its guesses happen to follow (never
    shown to the sampler). Mostly the target's favourite token, sometimes anything, including
    token 0 which the target never emits."""
    p, _ = distributions()
    g = torch.Generator().manual_seed(7)
    r = torch.rand(len(KS) - 1, VOCAB, generator=g)
    r = 0.1 * r / r.sum(-1, keepdim=True)
    r[torch.arange(len(KS) - 1), p[:-1].argmax(-1)] += 0.9
    return r


@dataclass
class SpecRun:
    ks: torch.Tensor  # [batch] draft length per request
    out: torch.Tensor  # [batch, max_K + 1]
    num_accepted: torch.Tensor  # [batch]
    drafts: torch.Tensor  # [batch, max_K] padded draft tokens


def speculation_inputs(point_mass: bool) -> dict:
    """A big batch: each request drafts K tokens i.i.d. per position (Q[j], or for the point-mass
    proposer a fixed arbitrary proposal law R[j] that is not passed to the sampler)."""
    p, q = distributions()
    proposal = point_mass_proposals() if point_mass else q
    ks = torch.tensor(KS).repeat(REQUESTS_PER_K)  # [batch]
    batch = ks.numel()
    # Position of every target row / draft token within its request.
    target_pos = torch.arange(int((ks + 1).sum())) - torch.repeat_interleave(
        torch.cumsum(ks + 1, 0) - (ks + 1), ks + 1
    )
    draft_pos = torch.arange(int(ks.sum())) - torch.repeat_interleave(torch.cumsum(ks, 0) - ks, ks)
    g = torch.Generator().manual_seed(11)
    drafts = torch.multinomial(proposal[draft_pos], 1, generator=g).squeeze(-1)
    return dict(
        draft_token_ids=drafts,
        num_draft_tokens=ks.tolist(),
        target_probs=p[target_pos],
        draft_probs=None if point_mass else q[draft_pos],
        is_greedy=torch.zeros(batch, dtype=torch.bool),
        generators=[None] * batch,
    )


@functools.cache
def speculation_run(point_mass: bool) -> SpecRun:
    inputs = speculation_inputs(point_mass)
    torch.manual_seed(1234)
    out, num_accepted = rejection_sample(**inputs)
    ks = torch.tensor(inputs["num_draft_tokens"])
    drafts = torch.full((ks.numel(), max(KS)), P)
    mask = torch.arange(max(KS))[None, :] < ks[:, None]
    drafts[mask] = inputs["draft_token_ids"]
    return SpecRun(ks=ks, out=out, num_accepted=num_accepted, drafts=drafts)


def test_distributions_are_noticeably_different() -> None:
    p, q = distributions()
    total_variation = 0.5 * (p[:-1] - q).abs().sum(-1)
    assert (total_variation > 0.2).all(), total_variation


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft_probs", "point_mass"])
def test_output_structure(point_mass: bool) -> None:
    run = speculation_run(point_mass)
    n, out = run.num_accepted, run.out
    assert ((n >= 0) & (n <= run.ks)).all()
    cols = torch.arange(out.shape[1])[None, :]
    # Accepted prefix equals the drafts, one real token after it, padding after that.
    prefix = cols < n[:, None]
    assert torch.equal(out[:, :-1][prefix[:, :-1]], run.drafts[prefix[:, :-1]])
    assert (out[cols == n[:, None]] >= 0).all()
    assert (out[cols > n[:, None]] == P).all()
    # Every path is exercised at every position: accepted, recovered and bonus.
    for k in KS[1:]:
        rows = run.ks == k
        for j in range(k):
            reached = rows & (n >= j)
            rejected_here = (reached & (n == j)).sum() / reached.sum()
            assert 0.05 < rejected_here < 0.95, (k, j, rejected_here)
        assert (rows & (n == k)).sum() > 1000  # bonus tokens


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft_probs", "point_mass"])
@pytest.mark.parametrize("position", [0, 1, 2, 3])
def test_emitted_tokens_follow_target(point_mass: bool, position: int) -> None:
    """The token emitted at ``position`` (given the earlier ones were accepted drafts) follows
    the target distribution at that position, pooled over all draft lengths: a mixture of
    accepted drafts, recovered tokens and bonus tokens (position 0 also includes K = 0)."""
    run = speculation_run(point_mass)
    p, _ = distributions()
    rows = run.num_accepted >= position
    assert rows.sum() > 1000
    assert_fits(run.out[rows, position], p[position])


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft_probs", "point_mass"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_bonus_tokens_follow_target_at_position_k(point_mass: bool, k: int) -> None:
    run = speculation_run(point_mass)
    p, _ = distributions()
    rows = (run.ks == k) & (run.num_accepted == k)
    bonus = run.out[rows, k]
    assert_fits(bonus, p[k])
    # Power check: the bonus is not compatible with the previous position's distribution, so
    # an off-by-one in the bonus row would be caught.
    assert goodness_of_fit(bonus, p[k - 1]).pvalue < 1e-9


def test_recovered_and_accepted_parts() -> None:
    """The two halves of the mixture separately: accepted drafts follow norm(min(p, q)) and
    recovered tokens follow the residual norm(max(p - q, 0))."""
    run = speculation_run(point_mass=False)
    p, q = distributions()
    has_draft = run.ks >= 1
    accepted = has_draft & (run.num_accepted >= 1)
    recovered = has_draft & (run.num_accepted == 0)
    assert_fits(run.out[accepted, 0], torch.minimum(p[0], q[0]))
    assert_fits(run.out[recovered, 0], (p[0] - q[0]).clamp(min=0))


# ---- Negative controls: wrong samplers must fail the same checks. ----


def test_negative_control_ignore_the_ratio() -> None:
    """Bug: accept every draft the target does not forbid, i.e. ignore min(1, p_t / p_d).
    Simulated with the real sampler by passing the target's own rows as draft_probs, which
    makes the ratio 1 wherever p_t(x) > 0. The emitted tokens then lean towards the draft."""
    inputs = speculation_inputs(point_mass=False)
    ks = torch.tensor(inputs["num_draft_tokens"])
    target_rows_of_drafts = torch.arange(int(ks.sum())) + torch.repeat_interleave(
        torch.arange(ks.numel()), ks
    )
    inputs["draft_probs"] = inputs["target_probs"][target_rows_of_drafts]
    torch.manual_seed(1234)
    out, num_accepted = rejection_sample(**inputs)
    p, _ = distributions()
    assert (num_accepted.float().mean() / ks.float().mean()) > 0.9
    fit = goodness_of_fit(out[:, 0], p[0])
    assert fit.impossible == 0  # support is right, only the chi-square can catch it
    assert fit.chi2_pvalue < 1e-9, fit
    assert goodness_of_fit(out[num_accepted >= 1, 1], p[1]).chi2_pvalue < 1e-9


def test_negative_control_always_accept() -> None:
    """Bug: always keep the draft (what a sampler would do with acceptance forced on). The
    first token then follows q for K >= 1, so p(0) = 0 tokens appear and the fit fails."""
    inputs = speculation_inputs(point_mass=False)
    ks = torch.tensor(inputs["num_draft_tokens"])
    run = speculation_run(point_mass=False)
    first = torch.where(ks >= 1, run.drafts[:, 0], run.out[:, 0])
    p, _ = distributions()
    fit = goodness_of_fit(first, p[0])
    assert fit.impossible > 0 and fit.pvalue == 0.0
    assert fit.chi2_pvalue < 1e-9, fit


def test_negative_control_recover_from_target_not_residual() -> None:
    """A classic bug: on rejection, resample from p_t instead of norm(max(p_t - p_d, 0)).
    The first emitted token then follows min(p, q) + TV(p, q) * p != p."""
    p, q = distributions()
    n = 20_000
    g = torch.Generator().manual_seed(5)
    drafts = torch.multinomial(q[0], n, replacement=True, generator=g)  # [n]
    accept = torch.rand(n, generator=g) * q[0][drafts] < p[0][drafts]
    resampled = sample_from_probs(p[0].expand(n, VOCAB), [None] * n)
    first = torch.where(accept, drafts, resampled)
    fit = goodness_of_fit(first, p[0])
    assert fit.impossible == 0  # support is right, only the chi-square can catch it
    assert fit.chi2_pvalue < 1e-9, fit


def test_sample_from_probs_distribution() -> None:
    g = torch.Generator().manual_seed(3)
    probs = torch.rand(VOCAB, generator=g)
    probs[4] = 0.0
    torch.manual_seed(0)
    tokens = sample_from_probs((probs * 3.0).expand(20_000, VOCAB))  # unnormalised is fine
    assert_fits(tokens, probs)


# --------------------------------------------------------------------------------------------
# 3. Seeded requests: reproducible, independent of the batch they run in.
# --------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Request:
    k: int
    greedy: bool
    seed: int | None
    drafts: torch.Tensor  # [k]
    target: torch.Tensor  # [k + 1, V]
    draft_probs: torch.Tensor  # [k, V]


def make_request(
    k: int, greedy: bool, seed: int | None, data_seed: int, vocab: int = 32
) -> Request:
    """A peaked target and a draft close to it, so seeded runs see accepted drafts, rejections
    and bonus tokens; greedy drafts match the target argmax for the first few positions."""
    g = torch.Generator().manual_seed(data_seed)
    target = (torch.randn(k + 1, vocab, generator=g) * 4).softmax(-1)
    draft_probs = 0.7 * target[:k] + 0.3 * torch.rand(k, vocab, generator=g).softmax(-1)
    drafts = torch.multinomial(draft_probs, 1, generator=g).view(k) if k else torch.zeros(0)
    if greedy:
        drafts[: k // 2 + 1] = target[: k // 2 + 1].argmax(-1)
    return Request(k, greedy, seed, drafts.long(), target, draft_probs)


def run_requests(
    requests: list[Request], point_mass: bool = False
) -> tuple[list[list[int]], list[int], list[torch.Generator | None]]:
    """Runs a batch with fresh generators; returns per-request emitted tokens (padding
    trimmed to K + 1), num_accepted, and the generators afterwards."""
    generators = [
        None if r.seed is None else torch.Generator().manual_seed(r.seed) for r in requests
    ]
    out, num_accepted = rejection_sample(
        torch.cat([r.drafts for r in requests]),
        [r.k for r in requests],
        torch.cat([r.target for r in requests]),
        None if point_mass else torch.cat([r.draft_probs for r in requests]),
        torch.tensor([r.greedy for r in requests]),
        generators,
    )
    rows = [out[i, : r.k + 1].tolist() for i, r in enumerate(requests)]
    return rows, num_accepted.tolist(), generators


def mixed_requests(seed_offset: int = 0) -> list[Request]:
    specs = [  # (k, greedy, seed)
        (4, False, 100),
        (3, False, None),
        (0, False, 101),
        (5, True, 102),
        (2, False, None),
        (5, False, 103),
        (1, True, None),
        (3, False, 104),
        (0, False, None),
        (4, False, 105),
    ]
    return [
        make_request(k, greedy, None if seed is None else seed + seed_offset, data_seed=i)
        for i, (k, greedy, seed) in enumerate(specs)
    ]


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft_probs", "point_mass"])
def test_seeded_batch_repeats_exactly(point_mass: bool) -> None:
    requests = mixed_requests()
    seeded = [i for i, r in enumerate(requests) if r.seed is not None]
    torch.manual_seed(0)
    rows_a, n_a, _ = run_requests(requests, point_mass)
    torch.manual_seed(999)  # unseeded requests may change; seeded ones must not
    rows_b, n_b, _ = run_requests(requests, point_mass)
    assert [rows_a[i] for i in seeded] == [rows_b[i] for i in seeded]
    assert [n_a[i] for i in seeded] == [n_b[i] for i in seeded]


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft_probs", "point_mass"])
def test_seeded_request_same_alone_and_in_batch(point_mass: bool) -> None:
    requests = mixed_requests()
    torch.manual_seed(0)
    batch_rows, batch_n, batch_gens = run_requests(requests, point_mass)
    for i, r in enumerate(requests):
        if r.seed is None:
            continue
        torch.manual_seed(i + 1)
        alone_rows, alone_n, alone_gens = run_requests([r], point_mass)
        assert alone_rows[0] == batch_rows[i], i
        assert alone_n[0] == batch_n[i], i
        # The generator advanced identically, so later steps stay in lockstep too.
        assert torch.equal(alone_gens[0].get_state(), batch_gens[i].get_state()), i
    # Another batch order / composition: reversed, with one more unseeded request.
    extra = make_request(3, False, None, data_seed=77)
    reordered = [extra, *reversed(requests)]
    rows, n, _ = run_requests(reordered, point_mass)
    for j, r in enumerate(reordered):
        if r.seed is not None:
            i = next(i for i, x in enumerate(requests) if x is r)
            assert rows[j] == batch_rows[i] and n[j] == batch_n[i], i


def test_seeds_actually_drive_the_randomness() -> None:
    rows_a, _, _ = run_requests(mixed_requests())
    rows_b, _, _ = run_requests(mixed_requests(seed_offset=1000))
    random_seeded = [i for i, r in enumerate(mixed_requests()) if r.seed and not r.greedy]
    assert any(rows_a[i] != rows_b[i] for i in random_seeded)


def test_sample_from_probs_per_row_generators() -> None:
    probs = torch.rand(3, 50).softmax(-1)  # [3, V]
    torch.manual_seed(0)
    batch = sample_from_probs(probs, [torch.Generator().manual_seed(s) for s in (1, 2, 3)])
    torch.manual_seed(1)
    mixed = sample_from_probs(probs, [None, torch.Generator().manual_seed(2), None])
    alone = sample_from_probs(probs[1:2], [torch.Generator().manual_seed(2)])
    assert batch[1] == mixed[1] == alone[0]


def test_greedy_verification_of_bf16_logits_is_that_of_their_fp32_copy():
    """A greedy step may hand the sampler the LM head's bf16 logits (LLMEngine.step skips the
    fp32 copy when only the argmax is read): acceptance and the bonus token must not change."""
    g = torch.Generator().manual_seed(0)
    num_draft = [3, 0, 2]
    logits = torch.randn(sum(num_draft) + len(num_draft), 500, generator=g).bfloat16()
    argmax = logits.float().argmax(dim=-1)
    # Drafts that match the target's argmax for a while, then do not.
    drafts = torch.tensor([argmax[0], argmax[1], (argmax[2] + 1) % 500, argmax[5], argmax[6]])
    greedy = torch.ones(3, dtype=torch.bool)
    fast = rejection_sample(drafts, num_draft, logits, None, greedy, [None] * 3)
    slow = rejection_sample(drafts, num_draft, logits.float(), None, greedy, [None] * 3)
    assert all(torch.equal(a, b) for a, b in zip(fast, slow, strict=True))
    assert fast[1].tolist() == [2, 0, 2]


def test_a_greedy_batch_is_verified_as_the_rejection_sampler_verifies_it():
    """emit_tokens verifies an all-greedy batch in plain Python over one argmax: over random
    batches (K = 0-5 per request, drafts that match for a while, fp32 and bf16 logits) it emits
    what the rejection sampler emits."""
    from specserve.sample.emit import emit_tokens
    from specserve.sampling_params import SamplingParams

    g = torch.Generator().manual_seed(0)
    accepted = []
    for trial in range(200):
        num_draft = torch.randint(0, 6, (int(torch.randint(1, 9, (1,), generator=g)),),
                                  generator=g).tolist()
        logits = torch.randn(sum(num_draft) + len(num_draft), 300, generator=g)
        logits[0, 7] = logits[0, 9] = logits[0].max() + 1  # a tie: the first maximum wins
        if trial % 3 == 0:
            logits[-1] = float("-inf")  # a row a grammar masked entirely
        if trial % 2:
            logits = logits.bfloat16()
        best = logits.float().argmax(dim=-1).tolist()
        drafts, row = [], 0
        for k in num_draft:
            right = int(torch.randint(0, k + 1, (1,), generator=g))
            drafts.append([best[row + j] if j < right else (best[row + j] + 1) % 300
                           for j in range(k)])
            row += k + 1
        # The engine may hold more guesses than it verifies (the token budget cut the step).
        held = [d + [best[0]] * (trial % 2) for d in drafts]
        params = [SamplingParams(temperature=0.0)] * len(num_draft)
        fast = emit_tokens(logits, params, [None] * len(num_draft), num_draft, held,
                           [None] * len(num_draft))
        out, num_accepted = rejection_sample(
            torch.tensor([t for d in drafts for t in d], dtype=torch.long), num_draft, logits,
            None, torch.ones(len(num_draft), dtype=torch.bool), [None] * len(num_draft))
        assert fast == [[t for t in r if t != PLACEHOLDER_TOKEN_ID] for r in out.tolist()]
        accepted += num_accepted.tolist()
    assert min(accepted) == 0 and max(accepted) == 5  # rejections and full acceptance both seen


def test_a_greedy_request_with_filters_takes_the_first_maximum_beside_a_random_one():
    """A greedy request with top_p / top_k (clients send temperature 0 with top_p 0.1) that
    verifies a draft beside a random request: its verdict and its token are the first maximum,
    what plain greedy decoding picks, even where two logits tie at the top. Filtered, which of
    the tied pair survives is up to the sort, which is not stable by contract (on this CPU it
    happens to keep index order, so the filtered rows gave the same answer here)."""
    from specserve.sample.emit import emit_tokens
    from specserve.sampling_params import SamplingParams

    for top in (dict(top_p=0.1), dict(top_k=1)):
        logits = torch.zeros(3, 50)
        logits[:2, 3] = logits[:2, 7] = 5.0  # the greedy request's two rows: 3 and 7 tie
        params = [SamplingParams(temperature=0.0, **top),
                  SamplingParams(temperature=1.0, top_p=0.9, seed=1)]
        out = emit_tokens(logits, params, [None, torch.Generator().manual_seed(1)], [1, 0],
                          [[7], []], [None, None])
        assert out[0] == [3], top  # the draft (the second maximum) is rejected
        out = emit_tokens(logits, params, [None, torch.Generator().manual_seed(1)], [1, 0],
                          [[3], []], [None, None])
        assert out[0] == [3, 3], top


def test_a_greedy_request_beside_a_random_one_reads_the_logits_not_their_softmax():
    """Two logits 1e-45 apart round to one probability: plain greedy decoding (the logits'
    argmax) takes the larger, later token 9, and so must a greedy request whose drafts are
    verified beside a random request (before, the probabilities' first maximum, token 5)."""
    from specserve.sample.emit import emit_tokens
    from specserve.sampling_params import SamplingParams

    logits = torch.full((3, 50), -1.0)
    logits[:2, 5] = 0.0
    logits[:2, 9] = torch.finfo(torch.float32).tiny * 1e-3  # a denormal above 0
    probs = torch.softmax(logits[0], -1)
    assert probs[5] == probs[9] == probs.max()  # 5 is the probabilities' first maximum
    greedy = SamplingParams(temperature=0.0)
    alone = emit_tokens(logits[:2], [greedy], [None], [1], [[9]], [None])
    assert alone == [[9, 9]]  # accepted, then the bonus token
    mixed = emit_tokens(logits, [greedy, SamplingParams(temperature=1.0, seed=1)],
                        [None, torch.Generator().manual_seed(1)], [1, 0], [[9], []],
                        [None, None])
    assert mixed[0] == alone[0]
