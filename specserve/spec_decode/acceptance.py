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

import numpy as np


class AcceptanceTracker:
    def __init__(self, num_positions: int = 4, prior: float = 0.5, decay: float = 0.9,
                 prior_weight: float = 3.0, global_decay: float = 0.95):
        self.num_positions = max(num_positions, 1)
        self.decay = decay
        self.global_decay = global_decay  # slower than a request's: it is a prior
        self.prior_weight = prior_weight
        self.global_succ = np.full(self.num_positions, prior * 2)  # a weak initial prior
        self.global_trials = np.full(self.num_positions, 2.0)
        self.per_request: dict[str, np.ndarray] = {}  # request_id -> [2, P] successes, trials

    @property
    def global_rates(self) -> np.ndarray:
        """[P] conditional acceptance per position."""
        return self.global_succ / self.global_trials

    @property
    def global_rate(self) -> float:
        """The first position's rate: how often a draft starts right."""
        return float(self.global_rates[0])

    def observe(self, request_id: str, num_draft: int, num_accepted: int) -> None:
        seen = min(num_accepted + (1 if num_accepted < num_draft else 0), self.num_positions)
        if seen == 0:
            return
        hit = (np.arange(seen) < num_accepted).astype(np.float64)
        s = self.per_request.get(request_id)
        if s is None:
            s = self.per_request[request_id] = np.zeros((2, self.num_positions))
        s[:, :seen] *= self.decay
        s[0, :seen] += hit
        s[1, :seen] += 1.0
        g = self.global_decay
        self.global_succ[:seen] = g * self.global_succ[:seen] + hit
        self.global_trials[:seen] = g * self.global_trials[:seen] + 1.0

    def estimate(self, request_id: str) -> np.ndarray:
        """[P] the request's conditional acceptance per position."""
        return self.estimates([request_id])[0]

    def estimates(self, request_ids: list[str]) -> np.ndarray:
        """[len(request_ids), P]: estimate() for many requests in one vector expression (the
        controller asks for the whole batch every step)."""
        prior = np.zeros((2, self.num_positions))
        s = np.stack([self.per_request.get(r, prior) for r in request_ids], axis=1)
        w = self.prior_weight
        return (s[0] + w * self.global_rates) / (s[1] + w)

    def forget(self, request_id: str) -> None:
        self.per_request.pop(request_id, None)
