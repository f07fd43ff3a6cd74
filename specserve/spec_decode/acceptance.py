"""Acceptance estimates per draft position: per request, with a prior from the proposer's recent
global rates.

A draft's j-th token is accepted only if tokens 1..j-1 were, and how likely that is depends on
j: measured on the embedded model with the n-gram proposer at K = 4, the conditional acceptance
of positions 1..4 was 0.30 / 0.68 / 0.75 / 0.88 on prose and 0.37 / 0.61 / 0.85 / 0.61 on RAG —
a wrong first guess is common, but a guess that starts right tends to stay right (it is copying
a passage). One geometric rate for all positions read prose as alpha ~0.35 and valued K = 4 at
half its real yield; the controller then chose short drafts where static K = 4 won. So we keep
a rate per position j, P(accept j | accepted 1..j-1).

Each verification of K drafts with a accepted is a run of Bernoulli trials: successes at
positions 1..a, plus one failure at position a + 1 if a < K; deeper positions are not observed.
Counts of a position decay geometrically each time it is observed, so the estimate follows a
request whose output changes character (prose turning into a copied JSON block, say).

The global rates enter each request's estimate as `prior_weight` pseudo-trials. One lucky
verification must not flip a request to speculating: on prose an n-gram match is accepted ~15%
of the time, and with a weight of 1 a single accepted guess read as alpha ~0.6, which made the
controller pay for drafts that then failed (measured: adaptive 7-14% below off on prose).

How much a request's own record should count is measured, not assumed: every first-position
trial is also scored as a prediction by each weight of PRIOR_WEIGHTS (the estimate that weight
gave just before the trial), and the weight with the least recent log-loss is used. What the
record is worth differs by proposer and workload. At concurrency 1 on unseen prompts (static
K = 1) the EAGLE head's per-request rates on prose and rag spread no more than chance, and a
fixed weight of 3 let a request's first few misses outweigh everything the server had seen: at
0.3 acceptance three misses in a row (one request in three) read 0.15, and the request stopped
drafting for good. n-gram's record also says whether the request is copying right now.

What a guess rests on says more still. The n-gram proposer's first guess follows the longest
earlier match of the context's last 1..4 tokens, and on the embedded model's own greedy replies
a guess from a 4-token match was accepted 61-81% of the time, one from a 1-token match 15-18% on
prose and rag (session 42's ngram_by_match.txt). A request's rates mix both, so they undervalued
the guesses that copy and overvalued the rest. The proposer reports that `evidence` with each
first guess (the match length; 0 when it has none to give), the tracker keeps a global
first-guess rate per evidence level, and a plan scales a request's first-position rate by its
level's rate over the rate of all first guesses (evidence_factor). A request's own record
already holds the levels its guesses followed (a request that copies has a high rate because
its matches are long), so the factor is taken over the mean factor of the guesses behind that
record: observed over expected, or a request that copies read 0.53 x 2.0 at a 4-token match.
The deeper positions keep their own conditional rates: a guess that starts right continues a
longer match.
"""

from __future__ import annotations

import math
import random

import numpy as np

PRIOR_TRIALS = 2.0  # the weight of the initial prior, in trials
# The weight of the global rates in a request's estimate, in trials, is chosen among these by
# their scores as predictions (module docstring).
PRIOR_WEIGHTS = (3.0, 6.0, 12.0, 25.0, 50.0)
START_PRIOR_WEIGHT = 12.0  # until the scores are trusted
SCORE_DECAY = 0.995  # per scored first guess: the scores weigh the last ~200
MIN_SCORED_TRIALS = 30  # a decayed count, reached after ~33 scored guesses
# sample_prior forgets this share of the global evidence per draw...
FORGET = 0.995
FORGET_FLOOR = 10.0  # ...down to this many trials
# An evidence level's first-guess rate starts from the rate of all first guesses, with this
# weight in trials
EVIDENCE_PRIOR_TRIALS = 10.0


class AcceptanceTracker:
    """Counts are plain Python lists, not arrays: a verification updates at most K_max numbers,
    and numpy's per-call overhead made each update ~50 us at concurrency 1 (the controller runs
    between every two forwards there)."""

    def __init__(self, num_positions: int = 4, prior: float = 0.5, decay: float = 0.9,
                 prior_weight: float | None = None, global_decay: float = 0.99):
        """prior_weight: a fixed weight of the global rates; None measures it (module
        docstring). global_decay: ~100 trials of memory. With ~20 (0.95) the EAGLE head's
        first-position rate on unseen prose wandered 0.19-0.42 in one run where its guesses were
        accepted ~0.28, across the plan's break-even."""
        self.num_positions = p = max(num_positions, 1)
        self.decay = decay
        self.global_decay = global_decay  # slower than a request's: it is a prior
        self.prior_weight = START_PRIOR_WEIGHT if prior_weight is None else prior_weight
        self.fit_prior_weight = prior_weight is None
        self._scores = [0.0] * len(PRIOR_WEIGHTS)  # decayed log-loss per candidate weight
        self._scored = 0.0  # decayed count of scored trials
        self.prior = prior
        self.global_succ = [prior * PRIOR_TRIALS] * p  # a weak initial prior
        self.global_trials = [PRIOR_TRIALS] * p
        # request_id -> successes per position, trials per position, and the summed evidence
        # factors of its first-position trials (2P + 1 numbers, decayed alike)
        self.per_request: dict[str, list[float]] = {}
        self._none = [0.0] * (2 * p + 1)
        self._rng = random.Random(0)  # sample_prior's draws
        # evidence level -> [first-guess successes, trials]; all levels decay at every first
        # guess with evidence, so that they and their pooled rate share one clock
        self.by_evidence: dict[int, list[float]] = {}

    @property
    def global_rates(self) -> np.ndarray:
        """[P] conditional acceptance per position."""
        return np.array(self.global_succ) / np.array(self.global_trials)

    @property
    def global_rate(self) -> float:
        """The first position's rate: how often a draft starts right."""
        return self.global_succ[0] / self.global_trials[0]

    def observe(self, request_id: str, num_draft: int, num_accepted: int,
                evidence: int = 0) -> None:
        """evidence: what the first guess rested on (the proposer's level; 0: none given)."""
        p = self.num_positions
        seen = min(num_accepted + (1 if num_accepted < num_draft else 0), p)
        if seen == 0:
            return
        s = self.per_request.get(request_id)
        if s is None:
            s = self.per_request[request_id] = [0.0] * (2 * p + 1)
        if self.fit_prior_weight:
            self._score(s[0], s[p], num_accepted > 0)
        d, g = self.decay, self.global_decay
        s[2 * p] = d * s[2 * p] + self._level_factor(evidence)  # before this guess's outcome
        if evidence:
            for e in self.by_evidence.values():
                e[0] *= g
                e[1] *= g
            e = self.by_evidence.setdefault(evidence, [0.0, 0.0])
            e[0] += 1.0 if num_accepted else 0.0
            e[1] += 1.0
        gs, gt = self.global_succ, self.global_trials
        for j in range(seen):
            hit = 1.0 if j < num_accepted else 0.0
            s[j] = d * s[j] + hit
            s[p + j] = d * s[p + j] + 1.0
            gs[j] = g * gs[j] + hit
            gt[j] = g * gt[j] + 1.0

    def _score(self, succ: float, trials: float, hit: bool) -> None:
        """Score each candidate weight's estimate of a first guess against its outcome (the
        request's record and the global rate as they were before it), and use the best."""
        g = self.global_rate
        scores = self._scores
        for i, w in enumerate(PRIOR_WEIGHTS):
            est = min(max((succ + w * g) / (trials + w), 0.01), 0.99)
            scores[i] = SCORE_DECAY * scores[i] - math.log(est if hit else 1.0 - est)
        self._scored = SCORE_DECAY * self._scored + 1.0
        if self._scored >= MIN_SCORED_TRIALS:
            self.prior_weight = PRIOR_WEIGHTS[min(range(len(scores)), key=scores.__getitem__)]

    def _level_factor(self, evidence: int) -> float:
        """How much likelier a first guess resting on this evidence level is accepted than a
        first guess with evidence at large (1.0 for none, or before there is a record)."""
        e = self.by_evidence.get(evidence) if evidence else None
        if e is None:
            return 1.0
        succ = sum(x[0] for x in self.by_evidence.values())
        trials = sum(x[1] for x in self.by_evidence.values())
        if succ <= 0.0:
            return 1.0
        pooled = succ / trials
        return (e[0] + EVIDENCE_PRIOR_TRIALS * pooled) / (e[1] + EVIDENCE_PRIOR_TRIALS) / pooled

    def evidence_factor(self, request_id: str, evidence: int) -> float:
        """What a first-position estimate of request_id is multiplied by for a guess resting on
        this evidence: the level's factor over the mean factor of the first guesses its record
        holds (the prior's pseudo-trials count as factor 1, the mix at large)."""
        if not evidence:
            return 1.0
        c = self.per_request.get(request_id, self._none)
        p, w = self.num_positions, self.prior_weight
        return self._level_factor(evidence) * (c[p] + w) / (c[2 * p] + w)

    def evidence_rates(self) -> dict[int, float]:
        """The first-guess rate per evidence level (stats)."""
        return {level: e[0] / e[1] for level, e in sorted(self.by_evidence.items()) if e[1]}

    def sample_prior(self) -> list[float]:
        """Global rates drawn from their posteriors (Thompson sampling): what a draft network's
        plan starts from, instead of the means (pass them to estimates / lower_estimates). Its
        rates are observed only while it drafts, and a few unlucky first verifications froze
        them: the EAGLE head on unseen prose at concurrency 1 missed the first five guesses it
        made, its first-position rate fell from the prior's 0.5 to 0.13-0.19, under the plan's
        break-even (~0.16 and the 3% margin), and it drafted at 1-4% of the steps of runs where
        its guesses were accepted 0.28-0.31 of the time and static K = 1 ran ~1.09x `off`. A
        draw lands above the break-even about as often as the evidence allows a rate that high,
        so a thin record is tried again soon and a thick one settles. The deeper positions,
        observed only when a draft reaches them, are drawn alike.

        Each draw first forgets a little of the evidence (FORGET per draw, down to FORGET_FLOOR
        trials; the means stay): a thick low record learned on one workload would otherwise keep
        the network off the next for good, since it is observed only where it drafts."""
        gs, gt, beta = self.global_succ, self.global_trials, self._rng.betavariate
        rates = []
        for j in range(self.num_positions):
            if gt[j] > FORGET_FLOOR:
                keep = max(FORGET, FORGET_FLOOR / gt[j])
                gs[j] *= keep
                gt[j] *= keep
            # at least half a trial each side: a record of only hits (or only misses) still
            # draws below (above) its mean now and then
            rates.append(beta(max(gs[j], 0.5), max(gt[j] - gs[j], 0.5)))
        return rates

    def estimate(self, request_id: str) -> np.ndarray:
        """[P] the request's conditional acceptance per position."""
        return self.estimates([request_id])[0]

    def estimates(self, request_ids: list[str],
                  prior_rates: list[float] | None = None) -> np.ndarray:
        """[len(request_ids), P]: estimate() for many requests (the controller asks for the whole
        batch every step). prior_rates: the global rates to start from (sample_prior); None,
        their means."""
        return self._rows(request_ids, None, prior_rates)

    def estimate_row(self, request_id: str, prior_rates: list[float] | None = None
                     ) -> list[float]:
        """estimates() for one request, as a list (the plan for a request running alone)."""
        return self._row(request_id, None, self._prior(prior_rates))

    def lower_estimates(self, request_ids: list[str], z: float = 1.0,
                        prior_rates: list[float] | None = None) -> np.ndarray:
        """estimates() minus z times the noise the request's own record puts into it: what the
        controller ranks requests by when it chooses among several. Picking the requests with
        the highest estimates picks the lucky ones: with a few trials each, the chosen requests'
        estimates run above what they then deliver (measured: rag at concurrency 16 speculated
        at an estimated ~0.6-0.8 and was accepted 34% of the time, 0.93x off).

        The luck is in the request's own trials, n of them: the estimate (s + w g) / (n + w)
        varies by sqrt(n p (1 - p)) / (n + w) around what it would read with the true rate p.
        So a request with no record is valued at the global rate, a short lucky streak is
        discounted most (n = w), and a long record little. Counting the prior's w pseudo-trials
        as noise too valued every fresh request at g - sqrt(g (1 - g) / w), 0.12 for g = 0.40:
        a draft network, whose requests are observed only while they draft, then never drafted
        at concurrency 2 where static K = 2 ran 1.2-1.3x off (trained draft, json)."""
        return self._rows(request_ids, z, prior_rates)

    def _rows(self, request_ids: list[str], z: float | None,
              rates: list[float] | None) -> np.ndarray:
        """The estimates (z None) or the lower estimates, in plain Python: the controller asks at
        every step of a small batch, right after a forward has flushed the CPU's caches, where
        the dozen numpy calls of the vector form took ~120 us for 8 requests (10 us when timed
        alone) and this loop ~40 (2-core Zen 5)."""
        prior = self._prior(rates)
        rows = [self._row(r, z, prior) for r in request_ids]
        return np.array(rows, dtype=np.float64).reshape(len(request_ids), self.num_positions)

    def _prior(self, rates: list[float] | None) -> list[float]:
        """The prior's pseudo-successes per position: weight x the global rates (or rates)."""
        w = self.prior_weight
        if rates is None:
            rates = [s / t for s, t in zip(self.global_succ, self.global_trials, strict=True)]
        return [w * g for g in rates]

    def _row(self, request_id: str, z: float | None, prior: list[float]) -> list[float]:
        p, w = self.num_positions, self.prior_weight
        c = self.per_request.get(request_id, self._none)
        row = []
        for j in range(p):
            own = c[p + j]
            est = (c[j] + prior[j]) / (own + w)
            if z is not None:
                # rounding may put est a hair past 1
                noise = math.sqrt(max(own * est * (1 - est), 0.0)) / (own + w)
                est = min(max(est - z * noise, 0.0), 1.0)
            row.append(est)
        return row

    def forget(self, request_id: str) -> None:
        self.per_request.pop(request_id, None)
