"""Which running requests draft how many tokens next step, and their guesses.

After each step the engine asks its SpeculationPlanner to propose: the policy chooses K per
decoding request (spec_decode/policy.py), the proposer guesses that many tokens
(spec_decode/ngram.py, suffix.py, draft_model.py, eagle.py), and the guesses wait in each request's
`spec_token_ids` for the next forward to verify. Requests whose own policy is `static` or
`off`, and every request under an engine-wide `off`, get their K without a plan. Planning and
look-ups are ordered so that a step where nobody speculates costs next to nothing: with few
requests a free proposer's guesses (n-gram) are looked up first and only the drafts that exist
are planned; with many, the plan comes first and an all-zero plan stands for a few steps. The
first guess a free proposer made but the plan did not use (the shadow, position K + 1) is kept
for LLMEngine.step, which checks it against the token the target emitted there: acceptance
estimates keep moving even while K = 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from specserve.engine.request import Request
from specserve.engine.scheduler import Scheduler
from specserve.spec_decode.policy import SpecPolicy
from specserve.spec_decode.proposer import Proposer

if TYPE_CHECKING:  # llm_engine imports this module
    from specserve.engine.llm_engine import EngineStats

REPLAN_STEPS = 8  # an all-zero speculation plan stands this many steps for the same batch
LOOKUP_FIRST_SEQS = 8  # up to this many requests, free guesses are looked up before planning


def draft_room(req: Request, max_model_len: int) -> int:
    """The most drafts req can use: never guess past max_tokens or the context, where
    those tokens could not be emitted."""
    return max(min(req.max_tokens - req.num_output_tokens - 1,
                   max_model_len - req.num_tokens - 1), 0)


class SpeculationPlanner:
    """Owns the state that outlives a step: the standing all-zero plan, the shadow guesses and
    where the next window of shadow look-ups starts, and the last proposal's time (for the
    policy's online cost model). The engine keeps the policy (it may be switched at any time)
    and passes it in."""

    def __init__(self, proposer: Proposer, scheduler: Scheduler, stats: EngineStats,
                 max_model_len: int):
        self.proposer = proposer
        self.scheduler = scheduler
        self.stats = stats  # EngineStats: draft_time accrues here
        self.max_model_len = max_model_len
        # Seconds of the last propose()'s proposer forwards, when some request drafted (0
        # otherwise): what the draft's cost model predicts. Its planning goes to stats only:
        # planning is paid at K = 0 too, and charged to the forwards it made a cheap draft
        # network look dearer.
        self.last_propose_time = 0.0
        # (size, prefill?, members or None) of the standing all-zero plan
        self._idle_plan: tuple[int, bool, frozenset[str] | None] | None = None
        self._idle_steps = 0
        self._shadow: dict[str, int] = {}  # request id -> unused guess for the next token
        self._shadow_cursor = 0  # where the next window of shadow look-ups starts

    def reset(self) -> None:
        """Forget the standing plan and the shadow guesses (the policy was switched)."""
        self._idle_plan, self._shadow = None, {}

    def forget(self, request_id: str) -> None:
        """A request ended: its unused guess must not be scored against a new request that
        takes its id before the next step (a client-chosen id, aborted and sent again), nor a
        standing plan made for it stand for that new request."""
        self._shadow.pop(request_id, None)
        if self._idle_plan is not None and request_id in (self._idle_plan[2] or ()):
            self._idle_plan = None

    def take_shadow(self) -> dict[str, int]:
        """The shadow guesses made for the step that just ran, handed over once."""
        shadow, self._shadow = self._shadow, {}
        return shadow

    @staticmethod
    def may_draft(req: Request, policy: SpecPolicy) -> bool:
        """Whether req can be given drafts at all: not if it drafts nothing (a seeded sampled
        request), may not (num_speculative_tokens 0: `"speculation": 0`, a beam search's
        beams), or is `off` (its own, or the engine's, which only its own `static` overrides).
        Such a request gets no plan, look-up or catch-up, and an EAGLE head no features."""
        own = req.params.speculation_policy
        return not (req.drafts_nothing or policy.request_k_max(req) == 0 or own == "off"
                    or (policy.name == "off" and own != "static"))

    def propose(self, policy: SpecPolicy) -> None:
        """Choose K per decoding request (the policy) and guess that many tokens: each
        request's `spec_token_ids` (and `spec_probs`) for the next step."""
        self.last_propose_time = 0.0
        reqs, caps, forced = [], [], []
        for req in self.scheduler.running:
            if req.num_computed_tokens != req.num_tokens - 1:
                continue  # still in prefill
            if req.spec_token_ids:
                continue  # not scheduled this step (token budget): its guesses still wait
            past = self.max_model_len - req.num_tokens - 1 <= 0
            if past:
                # Past the proposer's context (a draft model's may end before the target's)
                # for good: what it holds for req goes back now, not when req ends, and req is
                # `off` (planned, a draft model would make it a sequence again to catch up).
                self.proposer.free(req)
            reqs.append(req)
            req.spec_evidence = 0  # set again where this step's guesses are looked up
            caps.append(draft_room(req, self.max_model_len))
            forced.append(req.params.speculation_policy
                          if self.may_draft(req, policy) and not past else "off")
        if not reqs:
            return
        # Under an engine-wide `off`, the requests the engine decides for get K = 0 without a
        # plan or a look-up: rag's n-gram look-ups (indexing each new 2,500-token prompt) cost
        # `off` 1.2 ms of a 66 ms step at concurrency 64, work that no estimate used.
        free = [] if policy.name == "off" else [i for i, f in enumerate(forced)
                                                 if f in (None, "adaptive")]
        ks = [0 if f == "off" else policy.request_k_max(r) if f == "static" else 0
              for r, f in zip(reqs, forced, strict=True)]
        t0 = time.perf_counter()
        looked: dict[int, list[int]] = {}  # request index -> guesses already looked up
        if free:
            looked = self._choose(policy, reqs, free, ks, caps)
        ks = [min(k, cap) for k, cap in zip(ks, caps, strict=True)]
        if not any(ks):
            policy.record_choice(ks)
            return  # zero overhead when nobody speculates: no draft forward at all
        rest = [i for i in range(len(reqs)) if i not in looked]
        token_ids = [looked[i][:k] if i in looked else [] for i, k in enumerate(ks)]
        probs = None
        if any(ks[i] for i in rest):
            t_propose = time.perf_counter()
            proposal = self.proposer.propose([reqs[i] for i in rest], [ks[i] for i in rest])
            self.last_propose_time = time.perf_counter() - t_propose
            probs = proposal.probs
            for j, (i, tokens) in enumerate(zip(rest, proposal.token_ids, strict=True)):
                token_ids[i] = tokens
                if proposal.evidence is not None and ks[i]:  # not over a shadow look-up's
                    reqs[i].spec_evidence = proposal.evidence[j]
        self.stats.draft_time += time.perf_counter() - t0
        # What each request drafts: a static K finds no guess where n-gram has no match, a
        # draft network none where its pool is full.
        policy.record_choice([len(t) for t in token_ids])
        for req, tokens in zip(reqs, token_ids, strict=True):
            req.spec_token_ids, req.spec_from_grammar = tokens, False
        row = 0  # the proposal's probability rows are the rest's drafts, in order
        for i in rest if probs is not None else ():
            if token_ids[i]:
                reqs[i].spec_probs = probs[row:row + len(token_ids[i])]
                row += len(token_ids[i])

    def _choose(self, policy: SpecPolicy, reqs: list[Request], free: list[int],
                ks: list[int], caps: list[int]) -> dict[int, list[int]]:
        """The policy's K for reqs[i], i in free, written into ks. Returns the guesses already
        looked up (index -> tokens) for a proposer whose guesses cost nothing (n-gram)."""
        # The next step also carries the requests drafting what their grammar forces (whose
        # drafts it emits, near enough: the grammar allows nothing else).
        grammar = [r for r in self.scheduler.running if r.spec_from_grammar and r.spec_token_ids]
        forced = sum(1 + len(r.spec_token_ids) for r in grammar)
        # The step's other decoding requests: their KV reads and attention are in its time.
        chosen_for = set(free)
        others = [r.num_tokens for i, r in enumerate(reqs) if i not in chosen_for] + \
            [r.num_tokens for r in grammar]
        num_base = len(reqs) + sum(ks) + forced
        num_emitted = len(reqs) + forced
        num_prefill = self.scheduler.pending_prefill_tokens(num_base)
        free_reqs = [reqs[i] for i in free]

        def plan(limits: list[int], looked_up: bool = False) -> list[int]:
            catch_up = [self.proposer.catch_up_tokens(r) for r in free_reqs]
            evidence = [r.spec_evidence for r in free_reqs] if looked_up else None
            return policy.choose(free_reqs, len(self.scheduler.running), num_base + num_prefill,
                                 catch_up, num_prefill, limits, evidence, num_emitted, others)

        limits = [caps[i] for i in free]
        looked: dict[int, list[int]] = {}
        if self.proposer.free_lookahead and len(free) <= LOOKUP_FIRST_SEQS:
            # Few requests: their guesses (n-gram, ~3-25 us each) cost less than a plan, so look
            # first and plan only for the drafts that exist. A step where nobody has a guess
            # needs no plan at all (half the steps of json at concurrency 1), and every unused
            # guess is checked, so the estimates move on every step: after a workload with
            # poor acceptance the controller caught up on json at concurrency 1 only every
            # REPLAN_STEPS steps and trailed static K = 4 by 6%.
            found = self._look_up(policy, free_reqs, limits)
            looked = dict(zip(free, found, strict=True))
            chosen = plan([len(t) for t in found], True) if any(found) else [0] * len(free)
            self._idle_plan = None
            self._set_shadow(free_reqs, chosen, found)
        else:
            chosen = self._plan_then_look_up(policy, free_reqs, free, limits, plan, num_prefill,
                                             looked)
        for i, k in zip(free, chosen, strict=True):
            ks[i] = k
        return looked

    def _plan_then_look_up(self, policy: SpecPolicy, free_reqs: list[Request], free: list[int],
                           limits: list[int], plan: Callable[[list[int]], list[int]],
                           num_prefill: int, looked: dict[int, list[int]]) -> list[int]:
        """_choose for a batch of many: plan first, look guesses up only if the plan wants
        drafts (fills `looked`)."""
        # While the policy says "no drafts", little it decides on moves but the batch:
        # acceptance changes only through verifications and the n-gram checks made at each
        # re-plan below, and longer contexts, shrinking caps and more requests only make drafts
        # dearer. So an all-zero answer stands for up to REPLAN_STEPS steps while the batch is no
        # smaller (and prefill or not is unchanged): the policy's ~0.1-0.3 ms per step was 1-3%
        # of a decode step under load, where speculation is off anyway. Keying on the requests
        # themselves re-planned at nearly every step of a busy server, where some request
        # finishes and another joins every step (2.4 ms per step at concurrency 64, 5%).
        # A small batch is keyed on its members too: a request that joins it is planned at
        # once. Keyed on size alone, at concurrency 1 the last step of one request (no drafts
        # left to allow) kept the next request at K = 0 for its first 8 steps, a quarter of a
        # 32-token reply. A plan that allowed no drafts at all decides nothing and stands for
        # nothing.
        size, prefill = len(free_reqs), num_prefill > 0
        members = frozenset(r.request_id for r in free_reqs) if size <= LOOKUP_FIRST_SEQS \
            else None
        # A request running alone (here only with a draft network: a free proposer's few
        # requests are looked up first, above) is planned at every step. Its plan takes ~100 us
        # right after a forward, ~1% of a step at concurrency 1 (session 41's plan_time_c1.txt),
        # and each plan draws the network's rates (sample_prior): an all-zero
        # draw that stood for REPLAN_STEPS steps made every draw against drafting cost 8 steps
        # (EAGLE head, unseen prose at concurrency 1: K mean 0.29 with all-zero plans standing
        # one step, 0.84 re-planned every step, against static K = 1's 0.99). With more
        # requests the vector plan costs ~0.2-0.3 ms, and a standing answer still pays.
        alone = size == 1
        idle = (not alone and self._idle_plan is not None and size >= self._idle_plan[0]
                and (prefill, members) == self._idle_plan[1:]
                and self._idle_steps < REPLAN_STEPS)
        if idle:
            self._idle_steps += 1
            chosen = [0] * len(free)
        else:
            chosen = plan(limits)
            self._idle_plan, self._idle_steps = ((size, prefill, members), 0) \
                if not alone and not any(chosen) and any(limits) else (None, 0)
        # Guesses that cost nothing (n-gram) are looked up when the policy wants drafts, and it
        # plans again for the drafts that exist (a request with no match would be charged for
        # drafts it cannot make); also on every re-plan of an all-zero answer, so that unused
        # guesses are checked against the sampled token (_shadow) and the estimates keep moving
        # while K = 0 (without that, a few early misses froze n-gram at K = 0 on json at
        # concurrency 1, 0.83x static).
        if not self.proposer.free_lookahead:
            return chosen
        if any(chosen):
            found = self._look_up(policy, free_reqs, limits)
            looked.update(zip(free, found, strict=True))
            chosen = plan([len(t) for t in found], True)
            self._set_shadow(free_reqs, chosen, found)
        elif self._idle_steps == 0:
            # A fresh all-zero plan: check the first guesses of a rotating window of requests,
            # so that the estimates keep moving at a bounded cost (looking up all 64 requests
            # of a busy batch took ~1.5 ms).
            n = len(free_reqs)
            window = [(self._shadow_cursor + j) % n for j in range(min(n, LOOKUP_FIRST_SEQS))]
            self._shadow_cursor += len(window)
            some = [free_reqs[j] for j in window]
            self._set_shadow(some, [0] * len(some),
                             self._look_up(policy, some, [1] * len(some)))
        return chosen

    def _look_up(self, policy: SpecPolicy, reqs: list[Request], limits: list[int]
                  ) -> list[list[int]]:
        """The proposer's guesses for reqs, at most limits[i] (and the request's K_max) each;
        what each rests on goes to the request (spec_evidence), for the plan and for the
        verification or shadow check that follows."""
        k_max = policy.request_k_max
        proposal = self.proposer.propose(reqs, [min(c, k_max(r)) for c, r in
                                                zip(limits, reqs, strict=True)])
        if proposal.evidence is not None:
            for r, e in zip(reqs, proposal.evidence, strict=True):
                r.spec_evidence = e
        return proposal.token_ids

    def _set_shadow(self, reqs: list[Request], chosen: list[int], found: list[list[int]]
                    ) -> None:
        """Remember the first unused guess of each request, t[k] for a request that drafts k
        of its guesses: after the step it is checked against the token the target emitted at
        that position (when it got there), as a verification of one more draft."""
        self._shadow = {r.request_id: t[k] for r, k, t in zip(reqs, chosen, found, strict=True)
                        if len(t) > k}
