"""Continuous (iteration-level) batching with chunked prefill and preemption by recompute.

Every step the scheduler hands out a token budget: running requests first (decodes, unfinished
prefill chunks, speculative verification), then waiting requests in FCFS order. A request is
always "schedule N tokens": N = num_tokens + num_spec_tokens - num_computed_tokens, capped by the
budget and the chunk limit. When the KV pool runs out, the most recently admitted running request
is preempted: its blocks are freed and it is recomputed later (its prefix is likely still cached).

With `scheduling_policy="priority"` (vLLM's) both queues are kept in (priority, arrival) order,
lower values first: the waiting queue admits the most urgent request first, running requests get
the step's budget in that order (vLLM V1 keeps them in admission order; here an urgent prompt's
prefill goes before a less urgent request's decode), and the least urgent running request is the
one preempted. As in vLLM V1, a waiting request never evicts a running one: it takes the next
free slot, and one that does not fit the pool blocks the queue behind it. A request waiting for
an in-flight prefix lets only requests of its own priority pass it.

Prefix caching only serves blocks already computed. Requests that arrive together with a long
common prefix (a RAG document, n choices of one prompt) would each prefill it, several times over
and into several copies of its KV blocks. So a waiting request whose next uncached blocks a running
request is still prefilling waits for them (SGLang's in-batch prefix caching), when the prefix it
shares (cached and in flight) is MIN_SHARED_TOKENS_TO_WAIT tokens or longer.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from dataclasses import dataclass, field

from specserve.config import SchedulerConfig
from specserve.engine.block_manager import BlockManager
from specserve.engine.request import Request, RequestStatus

# Waiting costs the request a step or more of latency; computing the shared span again costs
# every request in the batch its compute (and the pool its blocks). Past a few hundred tokens the
# compute is worth more than a step here; a chat template's shared preamble (tens of tokens) is
# cheaper to compute twice than to delay a request for.
MIN_SHARED_TOKENS_TO_WAIT = 256


@dataclass(slots=True)
class SchedulerOutput:
    # (request, number of tokens to compute this step), in scheduling order
    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def total_num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Request] = deque()
        # In scheduling order: admission order (fcfs) or (priority, arrival); the last is the
        # next victim of a preemption.
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.by_priority = config.scheduling_policy == "priority"

    def add_request(self, req: Request) -> None:
        if self.by_priority:
            _insort(self.waiting, req)
        else:
            self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, req: Request) -> None:
        self.block_manager.free(req)
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        if self.by_priority:
            _insort(self.waiting, req)  # before every later arrival of its priority
        else:
            self.waiting.appendleft(req)

    def schedule(self) -> SchedulerOutput:
        cfg, bm = self.config, self.block_manager
        out = SchedulerOutput()
        budget = cfg.max_num_batched_tokens
        # Drafts never take the next token of a request behind: served in this order every
        # step, the front requests' drafts would use up the budget again and again, and the
        # requests behind (still holding their unverified drafts, so never proposed for anew)
        # would wait until the front ones finished.
        behind = sum(r.num_computed_tokens < r.num_tokens for r in self.running)
        # Nor does a request's drafts take a block that a request behind needs for its known
        # tokens: the blocks each running request needs for them, reserved until it is served.
        needs = [self._blocks_for_known(r) for r in self.running]
        reserved = sum(needs)
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            behind -= req.num_computed_tokens < req.num_tokens
            reserved -= needs[i]
            num_new = req.num_tokens + len(req.spec_token_ids) - req.num_computed_tokens
            num_new = min(num_new, budget, cfg.long_prefill_token_threshold)
            if num_new <= 0:
                i += 1
                continue
            known = req.num_tokens - req.num_computed_tokens
            if num_new > known:  # drafts: what the requests behind leave
                num_new = max(min(num_new, budget - behind), min(known, num_new))
            # Prefill chunks must not swallow draft tokens meant for a later verify step.
            if req.num_computed_tokens + num_new < req.num_tokens:
                req.spec_token_ids = []
            # Drafts are a bet: they never cost another request (or req itself) its KV. Without
            # them the step still decodes req's token; step() sees that no draft was verified
            # and rolls the proposer back.
            with_drafts, no_drafts = num_new, min(num_new, known)
            if with_drafts > no_drafts and not self._allocate_drafts(req, with_drafts, reserved):
                num_new = no_drafts
            while not bm.allocate(req, num_new):
                victim = self.running.pop()  # lowest priority: admitted last, or least urgent
                victim_needs = needs.pop()
                if victim is not req:
                    behind -= victim.num_computed_tokens < victim.num_tokens
                    reserved -= victim_needs
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            if req.status == RequestStatus.PREEMPTED:
                break
            if num_new < with_drafts and self._allocate_drafts(req, with_drafts, reserved):
                num_new = with_drafts  # a victim for the decode token left room for them
            out.scheduled.append((req, num_new))
            budget -= num_new
            i += 1
        if out.preempted:
            return out  # the pool is full: admit nothing new this step
        # Without prefix caching nothing is shared, so nothing is waited for.
        inflight = (self._inflight_prompt_blocks({r.request_id for r, _ in out.scheduled})
                    if self.waiting and bm.enable_prefix_caching else None)
        deferred: list[Request] = []
        waits_for_prefix: Request | None = None  # the first request deferred for a prefix
        # The adapters in use (by load, not id: a reloaded id is another group of weights).
        adapters = ({id(r.lora) for r in self.running if r.lora is not None}
                    if cfg.max_loras is not None else None)
        try:
            while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                req = self.waiting[0]
                if (waits_for_prefix is not None and self.by_priority
                        and req.priority > waits_for_prefix.priority):
                    break  # a wait for a shared prefix lets no less urgent request pass it
                if (adapters is not None and req.lora is not None
                        and id(req.lora) not in adapters and len(adapters) >= cfg.max_loras):
                    # vLLM's max_loras: it waits in its place and the others go on (held,
                    # the less urgent would wait for as long as other adapters run).
                    deferred.append(self.waiting.popleft())
                    continue
                # A preempted request is not held back: passed by others, it would be the
                # newest (fcfs) or least urgent again, the next victim, and its cached blocks
                # could be evicted.
                if (inflight and req.status != RequestStatus.PREEMPTED
                        and self._waits_for_inflight(req, inflight)):
                    deferred.append(self.waiting.popleft())
                    waits_for_prefix = waits_for_prefix or req
                    continue
                cached = bm.find_cached_prefix(req) if req.num_computed_tokens == 0 else []
                num_cached = len(cached) * bm.block_size
                num_new = min(req.num_tokens - num_cached, budget,
                              cfg.long_prefill_token_threshold)
                req.num_computed_tokens = num_cached
                if not bm.allocate(req, num_new, cached):
                    req.num_computed_tokens = 0
                    if not self.running:
                        raise RuntimeError(
                            f"request {req.request_id} cannot fit in an empty KV pool "
                            f"({bm.num_blocks} blocks of {bm.block_size}); raise kv_cache_memory")
                    break
                self.waiting.popleft()
                if req.status == RequestStatus.WAITING:  # not a readmission after preemption
                    req.num_cached_tokens = num_cached
                    req.scheduled_time = time.perf_counter()
                    if req.max_cached_prefix >= req.num_prompt_tokens - 1:
                        # a request that may not read the cache (prompt logprobs) is not a
                        # lookup, as in vLLM: it would lower the hit rate the metrics report
                        bm.record_prefix_lookup(req.num_tokens, num_cached)
                req.status = RequestStatus.RUNNING
                if self.by_priority:
                    _insort(self.running, req)
                else:
                    self.running.append(req)
                out.scheduled.append((req, num_new))
                budget -= num_new
                if adapters is not None and req.lora is not None:
                    adapters.add(id(req.lora))
                if inflight is not None:
                    self._add_inflight(inflight, req, scheduled=True)
        finally:
            self.waiting.extendleft(reversed(deferred))  # they keep their place in the queue
        return out

    def _blocks_for_known(self, req: Request) -> int:
        """New blocks req needs this step for its known tokens (a decode token or a prefill
        chunk), drafts aside."""
        known = min(req.num_tokens - req.num_computed_tokens,
                    self.config.long_prefill_token_threshold)
        return max(self.block_manager.blocks_to_add(req, known), 0) if known > 0 else 0

    def _allocate_drafts(self, req: Request, num_new: int, reserved: int) -> bool:
        """allocate(req, num_new) with its drafts, only if it leaves the reserved blocks free."""
        bm = self.block_manager
        return (bm.blocks_to_add(req, num_new) <= bm.num_free_blocks - reserved
                and bm.allocate(req, num_new))

    def _uncomputed_prompt_blocks(self, req: Request) -> list[int]:
        """Hashes of req's full prompt blocks that are not computed yet."""
        if req.num_computed_tokens >= req.num_prompt_tokens:
            return []
        hashes = self.block_manager.prompt_block_hashes(req)
        return hashes[req.num_computed_tokens // self.block_manager.block_size:]

    def _inflight_prompt_blocks(self, scheduled: set[str]) -> dict[int, float]:
        """Prompt blocks that running requests are still prefilling (this step included), and
        the most urgent priority among the requests prefilling each (-inf: one scheduled in
        this step)."""
        inflight: dict[int, float] = {}
        for r in self.running:
            self._add_inflight(inflight, r, r.request_id in scheduled)
        return inflight

    def _add_inflight(self, inflight: dict[int, float], req: Request, scheduled: bool) -> None:
        urgency = -math.inf if scheduled else req.priority
        for h in self._uncomputed_prompt_blocks(req):
            inflight[h] = min(urgency, inflight.get(h, urgency))

    def _waits_for_inflight(self, req: Request, inflight: dict[int, float]) -> bool:
        """Whether a running request is still prefilling blocks that follow req's cached prefix,
        and what req shares (cached and in flight) is long enough to wait for. The whole of it
        counts, not just what is left in flight: a request that shares a long prefix waits for
        the rest of it, usually one more step, rather than computing the sharer's last chunk
        again. Hashes only, no token comparison (find_cached_prefix does that on admission),
        so that a long queue is cheap to pass over; chained hashes make a match a whole-prefix
        match, and a collision costs a wait, never wrong KV. Under the priority policy a less
        urgent sharer is waited for only while it is scheduled in this step: it may get no
        budget for as long as more urgent requests fill it, and req would wait with it."""
        if req.max_cached_prefix < req.num_prompt_tokens - 1:
            return False  # it may not read the prefix (prompt logprobs): nothing to wait for
        cached = self.block_manager.cached
        shared = in_flight = 0
        for h in self.block_manager.prompt_block_hashes(req):
            if h not in cached:  # cached first: a block one request registered while another
                # still prefills its own copy can be served now
                if h not in inflight or (self.by_priority and inflight[h] > req.priority):
                    break
                in_flight += 1
            shared += 1
        return in_flight > 0 and shared * self.block_manager.block_size >= MIN_SHARED_TOKENS_TO_WAIT

    def pending_prefill_tokens(self, num_decode_tokens: int) -> int:
        """A guess at the prefill tokens the next step will carry next to num_decode_tokens:
        unfinished prompts of running requests, then waiting prompts, within the token budget
        (prefix-cache hits, arrivals before the step, and waits for in-flight prefixes are not
        known yet)."""
        cfg = self.config
        chunk = cfg.long_prefill_token_threshold
        total = sum(min(r.num_prompt_tokens - r.num_computed_tokens, chunk)
                    for r in self.running if r.num_computed_tokens < r.num_prompt_tokens)
        room = cfg.max_num_seqs - len(self.running)
        for req in self.waiting:
            if room <= 0 or total >= cfg.max_num_batched_tokens:
                break
            total += min(req.num_tokens - req.num_computed_tokens, chunk)
            room -= 1
        return max(min(total, cfg.max_num_batched_tokens - num_decode_tokens), 0)

    def finish(self, req: Request, status: RequestStatus) -> None:
        """Take req out of the queues and free its blocks (finished or aborted)."""
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif not req.is_finished and req in self.waiting:
            self.waiting.remove(req)
        req.status = status
        self.block_manager.free(req)


def _urgency(req: Request) -> tuple[int, float]:
    return req.priority, req.arrival_time


def _insort(queue: list[Request] | deque[Request], req: Request) -> None:
    """Insert req after every request at least as urgent (ties keep their arrival order)."""
    queue.insert(bisect.bisect_right(queue, _urgency(req), key=_urgency), req)
