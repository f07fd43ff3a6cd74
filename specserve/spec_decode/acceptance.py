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
"""

from __future__ import annotations

import math

import numpy as np

PRIOR_TRIALS = 2.0  # the weight of the initial prior, in trials


class AcceptanceTracker:
    """Counts are plain Python lists, not arrays: a verification updates at most K_max numbers,
    and numpy's per-call overhead made each update ~50 us at concurrency 1 (the controller runs
    between every two forwards there)."""

    def __init__(self, num_positions: int = 4, prior: float = 0.5, decay: float = 0.9,
                 prior_weight: float = 3.0, global_decay: float = 0.95):
        self.num_positions = p = max(num_positions, 1)
        self.decay = decay
        self.global_decay = global_decay  # slower than a request's: it is a prior
        self.prior_weight = prior_weight
        self.prior = prior
        self.global_succ = [prior * PRIOR_TRIALS] * p  # a weak initial prior
        self.global_trials = [PRIOR_TRIALS] * p
        # request_id -> successes per position, then trials per position (2P numbers)
        self.per_request: dict[str, list[float]] = {}
        self._none = [0.0] * (2 * p)

    @property
    def global_rates(self) -> np.ndarray:
        """[P] conditional acceptance per position."""
        return np.array(self.global_succ) / np.array(self.global_trials)

    @property
    def global_rate(self) -> float:
        """The first position's rate: how often a draft starts right."""
        return self.global_succ[0] / self.global_trials[0]

    def observe(self, request_id: str, num_draft: int, num_accepted: int) -> None:
        p = self.num_positions
        seen = min(num_accepted + (1 if num_accepted < num_draft else 0), p)
        if seen == 0:
            return
        s = self.per_request.get(request_id)
        if s is None:
            s = self.per_request[request_id] = [0.0] * (2 * p)
        d, g = self.decay, self.global_decay
        gs, gt = self.global_succ, self.global_trials
        for j in range(seen):
            hit = 1.0 if j < num_accepted else 0.0
            s[j] = d * s[j] + hit
            s[p + j] = d * s[p + j] + 1.0
            gs[j] = g * gs[j] + hit
            gt[j] = g * gt[j] + 1.0

    def relax(self, keep: float = 0.99) -> None:
        """Forget a little of the global rates, toward the initial prior: one step of it per
        plan. A draft network's rates are observed only while it drafts, so a low rate (learned
        on prose, say) kept every later request at K = 0, and nothing could correct it: in the
        lab the trained 3-layer draft never drafted on json or sql at concurrency 1 after a
        prose run (sql: 38 tok/s against 55 in the run that did). Relaxed, an unobserved rate
        drifts back up (from 0.13 over ~20 trials: half-way to the prior in ~240 plans) until the
        plan tries a draft again, and the trial's verdict pulls it where it belongs. The plan
        still decides whether a trial pays, so under load, where drafts are dear, nothing
        changes."""
        fresh = (1.0 - keep) * PRIOR_TRIALS
        gs, gt = self.global_succ, self.global_trials
        for j in range(self.num_positions):
            gs[j] = keep * gs[j] + fresh * self.prior
            gt[j] = keep * gt[j] + fresh

    def estimate(self, request_id: str) -> np.ndarray:
        """[P] the request's conditional acceptance per position."""
        return self.estimates([request_id])[0]

    def estimates(self, request_ids: list[str]) -> np.ndarray:
        """[len(request_ids), P]: estimate() for many requests (the controller asks for the whole
        batch every step)."""
        return self._rows(request_ids, None)

    def lower_estimates(self, request_ids: list[str], z: float = 1.0) -> np.ndarray:
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
        return self._rows(request_ids, z)

    def _rows(self, request_ids: list[str], z: float | None) -> np.ndarray:
        """The estimates (z None) or the lower estimates, in plain Python: the controller asks at
        every step of a small batch, right after a forward has flushed the CPU's caches, where
        the dozen numpy calls of the vector form took ~120 us for 8 requests (10 us when timed
        alone) and this loop ~40 (2-core Zen 5)."""
        p, w = self.num_positions, self.prior_weight
        prior = [w * (s / t) for s, t in zip(self.global_succ, self.global_trials, strict=True)]
        rows = []
        for r in request_ids:
            c = self.per_request.get(r, self._none)
            row = []
            for j in range(p):
                own = c[p + j]
                est = (c[j] + prior[j]) / (own + w)
                if z is not None:
                    # rounding may put est a hair past 1
                    noise = math.sqrt(max(own * est * (1 - est), 0.0)) / (own + w)
                    est = min(max(est - z * noise, 0.0), 1.0)
                row.append(est)
            rows.append(row)
        return np.array(rows, dtype=np.float64).reshape(len(request_ids), p)

    def forget(self, request_id: str) -> None:
        self.per_request.pop(request_id, None)
