"""Acceptance estimates: per request, with a prior from the proposer's recent global rate.

Each verification of K drafts with a accepted is read as a run of Bernoulli trials: a successes,
plus one failure if a < K. Counts decay geometrically so the estimate follows a request whose
output changes character (prose turning into a copied JSON block, say).

The global rate enters each request's estimate as `prior_weight` pseudo-trials. One lucky
verification must not flip a request to speculating: on prose an n-gram match is accepted ~15%
of the time, and with a weight of 1 a single accepted guess read as alpha ~0.6, which made the
controller pay for drafts that then failed (measured: adaptive 7-14% below off on prose).
"""

from __future__ import annotations


class AcceptanceTracker:
    def __init__(self, prior: float = 0.5, decay: float = 0.9, prior_weight: float = 3.0):
        self.decay = decay
        self.prior_weight = prior_weight
        self.global_succ = prior * 2  # the global rate starts as a weak prior
        self.global_trials = 2.0
        self.per_request: dict[str, list[float]] = {}  # request_id -> [successes, trials]

    @property
    def global_rate(self) -> float:
        return self.global_succ / self.global_trials

    def observe(self, request_id: str, num_draft: int, num_accepted: int) -> None:
        succ = float(num_accepted)
        trials = succ + (1.0 if num_accepted < num_draft else 0.0)
        s = self.per_request.setdefault(request_id, [0.0, 0.0])
        s[0] = self.decay * s[0] + succ
        s[1] = self.decay * s[1] + trials
        g = 0.95  # the global rate moves slower than a request's: it is a prior
        self.global_succ = g * self.global_succ + succ
        self.global_trials = g * self.global_trials + trials

    def estimate(self, request_id: str) -> float:
        succ, trials = self.per_request.get(request_id, (0.0, 0.0))
        return (succ + self.prior_weight * self.global_rate) / (trials + self.prior_weight)

    def forget(self, request_id: str) -> None:
        self.per_request.pop(request_id, None)
