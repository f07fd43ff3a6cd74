"""Speculation policies: how many draft tokens each running request verifies next step.

- `off`: never speculate.
- `static`: always K (the request's own `num_speculative_tokens` if set).
- `batch-threshold:N`: K while at most N requests run, else 0 (vLLM V0's
  `speculative_disable_by_batch_size`).
- `schedule:B1=K1,B2=K2,...`: K from a batch-size table, the first row whose B >= batch
  (vLLM V1 / TensorRT-LLM style); batches larger than every row get 0.
- `adaptive` (default): K_i from the measured cost model and each request's acceptance
  (cost_model.py).

A request's `num_speculative_tokens` is its own K_max (0 switches speculation off for it).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from specserve.engine.request import Request
from specserve.spec_decode.acceptance import AcceptanceTracker
from specserve.spec_decode.cost_model import (
    StepCostModel,
    beyond,
    choose_for_one_request,
    choose_num_speculative_tokens,
    runs_context,
)

POLICY_NAMES = ("off", "static", "batch-threshold:N", "schedule:B=K,...", "adaptive")
# The most tokens a request's catch-up is spread over (cost_model.py): past its max_tokens it may
# still stop at any EOS, and a long horizon would make any catch-up look free.
CATCH_UP_HORIZON = 256
MAX_RATE = 0.99  # a first-guess rate scaled by its evidence stays a probability short of 1
K_MEAN_DECAY = 0.99  # per planned step: the reported K mean covers about the last 100 steps


def parse_schedule(text: str) -> list[tuple[int, int]]:
    try:
        rows = sorted((int(b), int(k)) for b, k in (item.split("=") for item in text.split(",")))
    except ValueError:
        raise ValueError(f"bad schedule {text!r}: expected e.g. 'schedule:1=4,8=2,16=0'") from None
    if any(b < 1 or k < 0 for b, k in rows):
        raise ValueError(f"bad schedule {text!r}: batch sizes are >= 1 and K >= 0")
    return rows


def parse_threshold(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"bad batch-threshold {text!r}: expected a number of requests >= 0")
    return n


class SpecPolicy:
    """Base: static K. Subclasses override `choose`."""

    name = "static"

    def __init__(self, k_max: int):
        self.k_max = k_max
        self.acceptance = AcceptanceTracker(k_max)
        self.k_histogram: Counter[int] = Counter()  # chosen K per (request, step)
        self._recent_k = (0.0, 0.0)  # decayed (sum of chosen K, number of choices)
        self.last_predicted_s: float | None = None
        self.num_predictions = 0
        self.abs_error_s = 0.0  # sum |predicted - actual| step time
        self.sum_actual_s = 0.0
        self.sum_predicted_s = 0.0  # with sum_actual_s: the sign of the error, its mean size

    def request_k_max(self, req: Request) -> int:
        """A request's own num_speculative_tokens, at most the engine's K_max (the acceptance
        estimates cover that many positions, and the scheduler's budget was sized for it)."""
        k = req.params.num_speculative_tokens
        return self.k_max if k is None else min(k, self.k_max)

    def choose(self, reqs: list[Request], num_running: int, num_base_tokens: int,
               catch_up: list[int], num_prefill_tokens: int = 0,
               caps: list[int] | None = None, evidence: list[int] | None = None,
               num_emitted: int | None = None, other_contexts: list[int] = ()) -> list[int]:
        """K per request in reqs (the decoding ones); num_base_tokens: what the next step
        carries without drafts, num_prefill_tokens of it prefill chunks; catch_up: tokens the
        draft model must process before it can propose for each request; caps: the most drafts
        each request can still use (max_tokens, context) — the engine applies them after;
        evidence: what each request's guesses rest on, where they were looked up first
        (acceptance.py); num_emitted: the tokens the step emits whatever the plan (one per
        decoding request, and the grammar-forced drafts), None: one per request in reqs;
        other_contexts: the contexts of the step's other decoding requests (not in reqs)."""
        return [self.request_k_max(r) for r in reqs]

    def record_choice(self, ks: list[int]) -> None:
        self.k_histogram.update(ks)
        # A recent mean for the gauge (~100 steps): the histogram's is since start, and a
        # long-running server's barely moves when the load changes what the controller picks.
        self._recent_k = (K_MEAN_DECAY * self._recent_k[0] + sum(ks),
                          K_MEAN_DECAY * self._recent_k[1] + len(ks))

    def observe_verification(self, req: Request, num_draft: int, num_accepted: int) -> None:
        self.acceptance.observe(req.request_id, num_draft, num_accepted, req.spec_evidence)

    def observe_step(self, num_tokens: int, forward_s: float,
                     draft_forwards: list[tuple[int, int, list[tuple[int, int]]]], draft_s: float,
                     runs: list[tuple[int, int]] = (), num_without_logits: int = 0) -> None:
        """A step ran: num_tokens in one target forward of forward_s seconds, draft forwards of
        (tokens, sequences, runs) each in draft_s seconds; runs: (first position, tokens) of each
        scheduled sequence (the context the forward's attention read); num_without_logits of
        the tokens needed no logits (prefill chunks)."""
        if self.last_predicted_s is not None:
            actual = forward_s + draft_s
            self.abs_error_s += abs(self.last_predicted_s - actual)
            self.sum_actual_s += actual
            self.sum_predicted_s += self.last_predicted_s
            self.num_predictions += 1
            self.last_predicted_s = None

    def forget(self, req: Request) -> None:
        self.acceptance.forget(req.request_id)

    def stats(self, running: list[Request]) -> dict:
        return {
            "spec_policy": self.name,
            "spec_k_max": self.k_max,
            "spec_k_histogram": dict(sorted(self.k_histogram.items())),
            # over about the last 100 steps (the histogram holds every one)
            "spec_k_mean": self._recent_k[0] / self._recent_k[1] if self._recent_k[1] else 0.0,
            "spec_global_acceptance": self.acceptance.global_rate,
            # the global rates' weight in a request's estimate, in trials (fixed or measured)
            "spec_prior_weight": self.acceptance.prior_weight,
            "spec_position_acceptance": [round(float(a), 3)
                                         for a in self.acceptance.global_rates],
            # first guesses by what they rested on (n-gram: the match length)
            "spec_evidence_acceptance": {level: round(rate, 3) for level, rate in
                                         self.acceptance.evidence_rates().items()},
            "spec_request_acceptance": {r.request_id: round(float(self.acceptance.estimate(
                r.request_id)[0]), 3) for r in running[:64]},
            "spec_step_time_rel_error": self.abs_error_s / self.sum_actual_s
            if self.sum_actual_s else None,
            # mean predicted and measured time of the steps the cost model priced (ms)
            "spec_step_time_predicted_ms": 1e3 * self.sum_predicted_s / self.num_predictions
            if self.num_predictions else None,
            "spec_step_time_actual_ms": 1e3 * self.sum_actual_s / self.num_predictions
            if self.num_predictions else None,
        }


class OffPolicy(SpecPolicy):
    name = "off"

    def choose(self, reqs, num_running, num_base_tokens, catch_up, num_prefill_tokens=0,
               caps=None, evidence=None, num_emitted=None, other_contexts=()):
        return [0] * len(reqs)


class BatchThresholdPolicy(SpecPolicy):
    def __init__(self, k_max: int, threshold: int):
        super().__init__(k_max)
        self.threshold = threshold
        self.name = f"batch-threshold:{threshold}"

    def choose(self, reqs, num_running, num_base_tokens, catch_up, num_prefill_tokens=0,
               caps=None, evidence=None, num_emitted=None, other_contexts=()):
        if num_running > self.threshold:
            return [0] * len(reqs)
        return [self.request_k_max(r) for r in reqs]


class SchedulePolicy(SpecPolicy):
    def __init__(self, k_max: int, rows: list[tuple[int, int]]):
        super().__init__(k_max)
        self.rows = rows
        self.name = "schedule:" + ",".join(f"{b}={k}" for b, k in rows)

    def choose(self, reqs, num_running, num_base_tokens, catch_up, num_prefill_tokens=0,
               caps=None, evidence=None, num_emitted=None, other_contexts=()):
        k = next((k for b, k in self.rows if num_running <= b), 0)
        return [min(k, self.request_k_max(r)) for r in reqs]


class AdaptivePolicy(SpecPolicy):
    name = "adaptive"

    def __init__(self, k_max: int, target_cost: StepCostModel,
                 draft_cost: StepCostModel | None):
        super().__init__(k_max)
        self.target_cost = target_cost
        self.draft_cost = draft_cost
        self.prev_total: int | None = None

    def choose(self, reqs, num_running, num_base_tokens, catch_up, num_prefill_tokens=0,
               caps=None, evidence=None, num_emitted=None, other_contexts=()):
        ids = [r.request_id for r in reqs]
        # A free proposer's rates move every step (shadow checks); a draft network's only where
        # it drafts, so it explores: its plan starts from rates drawn from their posteriors.
        drawn = self.acceptance.sample_prior() if self.draft_cost is not None else None
        other = float(beyond(other_contexts, self.target_cost.base_context).sum()) \
            if len(other_contexts) else 0.0
        if len(reqs) == 1:  # its own estimate, planned in plain numbers
            req = reqs[0]
            k_max = self.request_k_max(req) if caps is None else \
                min(self.request_k_max(req), caps[0])
            row = self.acceptance.estimate_row(req.request_id, drawn)
            if evidence is not None:
                row[0] = min(row[0] * self.acceptance.evidence_factor(req.request_id,
                                                                      evidence[0]), MAX_RATE)
            k, _, _ = choose_for_one_request(
                row, k_max, num_base_tokens,
                self.target_cost, self.draft_cost, float(catch_up[0]), self._horizon(req),
                self.prev_total, context=req.num_tokens, num_prefill_tokens=num_prefill_tokens,
                num_emitted=num_emitted, other_context=other)
            self.prev_total = k
            return [k]
        # Several: lower estimates, so that drafts go to the requests that are likely good
        # rather than those that were lucky (acceptance.py).
        alphas = self.acceptance.lower_estimates(ids, prior_rates=drawn)
        if evidence is not None:
            factor = self.acceptance.evidence_factor
            alphas[:, 0] = np.minimum(
                alphas[:, 0] * [factor(i, e) for i, e in zip(ids, evidence, strict=True)],
                MAX_RATE)
        k_max = np.array([self.request_k_max(r) for r in reqs])
        if caps is not None:  # drafts past the cap would be cut: do not plan (or pay) for them
            k_max = np.minimum(k_max, caps)
        ks, _, _ = choose_num_speculative_tokens(
            alphas, k_max, num_base_tokens, self.target_cost, self.draft_cost,
            np.asarray(catch_up, dtype=np.float64), self.prev_total,
            contexts=np.array([r.num_tokens for r in reqs]), num_prefill_tokens=num_prefill_tokens,
            horizon=np.array([self._horizon(r) for r in reqs]), num_emitted=num_emitted,
            other_context=other)
        self.prev_total = int(ks.sum())
        return ks.tolist()

    @staticmethod
    def _horizon(req: Request) -> int:
        """Tokens a catch-up's cost is spread over (cost_model.py)."""
        return min(req.max_tokens - req.num_output_tokens, CATCH_UP_HORIZON)

    def observe_step(self, num_tokens, forward_s, draft_forwards, draft_s, runs=(),
                     num_without_logits=0):
        """The step's error is the cost model's, for the step as it ran: a plan's forecast also
        misses what arrives after it (a 300 ms prefill forecast as a 19 ms decode step), which
        says nothing about the model."""
        self.last_predicted_s = self.target_cost.update(
            num_tokens, forward_s, *runs_context(runs, self.target_cost.base_context),
            num_without_logits)
        if self.draft_cost is not None and draft_forwards:
            self.last_predicted_s += self.draft_cost.update_forwards(draft_forwards, draft_s)
        super().observe_step(num_tokens, forward_s, draft_forwards, draft_s, runs,
                             num_without_logits)


def build_policy(spec: str, k_max: int, target_cost: StepCostModel | None = None,
                 draft_cost: StepCostModel | None = None) -> SpecPolicy:
    if k_max < 1:
        raise ValueError(f"K_max must be >= 1, got {k_max} (the 'off' policy drafts nothing)")
    if spec == "off":
        return OffPolicy(k_max)
    if spec == "static":
        return SpecPolicy(k_max)
    if spec.startswith("batch-threshold:"):
        return BatchThresholdPolicy(k_max, parse_threshold(spec.split(":", 1)[1]))
    if spec.startswith("schedule:"):
        return SchedulePolicy(k_max, parse_schedule(spec.split(":", 1)[1]))
    if spec == "adaptive":
        assert target_cost is not None
        return AdaptivePolicy(k_max, target_cost, draft_cost)
    raise ValueError(f"unknown speculation policy {spec!r}; choose one of {POLICY_NAMES}")
