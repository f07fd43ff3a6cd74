"""Unit tests for the continuous-batching scheduler (specserve/engine/scheduler.py), driven by
hand with a fake engine update: no model is loaded."""

from __future__ import annotations

import math
import random

import pytest

from specserve.config import SchedulerConfig
from specserve.engine.block_manager import BlockManager
from specserve.engine.request import Request, RequestStatus
from specserve.engine.scheduler import MIN_SHARED_TOKENS_TO_WAIT, Scheduler, SchedulerOutput
from specserve.sampling_params import SamplingParams

BS = 4
FAKE_TOKEN = 999_999


# ---- helpers ---------------------------------------------------------------------------------
def toks(seed: int, n: int) -> list[int]:
    return [seed * 1000 + i for i in range(n)]


def make_req(rid: str, tokens: list[int], max_tokens: int = 4, priority: int = 0) -> Request:
    req = Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens))
    req.priority = priority
    return req


def make_sched(num_blocks: int = 64, budget: int = 64, max_seqs: int = 16, chunk: int = 512,
               caching: bool = True, policy: str = "fcfs") -> tuple[Scheduler, BlockManager]:
    bm = BlockManager(num_blocks, BS, caching)
    cfg = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs,
                          long_prefill_token_threshold=chunk, scheduling_policy=policy)
    return Scheduler(cfg, bm), bm


def add(sched: Scheduler, *reqs: Request) -> None:
    for r in reqs:
        sched.add_request(r)


def check_step(sched: Scheduler, out: SchedulerOutput) -> None:
    """Invariants of one schedule() result, checked before the update."""
    cfg, bm = sched.config, sched.block_manager
    assert out.total_num_tokens <= cfg.max_num_batched_tokens
    assert len(sched.running) <= cfg.max_num_seqs
    seen = set()
    for req, n in out.scheduled:
        assert req.request_id not in seen
        seen.add(req.request_id)
        assert req.status == RequestStatus.RUNNING and req in sched.running
        assert 1 <= n <= cfg.long_prefill_token_threshold
        assert req.num_computed_tokens + n <= req.num_tokens + len(req.spec_token_ids)
        assert len(req.block_ids) * BS >= req.num_computed_tokens + n
    for req in sched.waiting:
        assert req.block_ids == [] and req.num_computed_tokens == 0
    held = sum(len(r.block_ids) for r in sched.running)
    assert sum(b.ref_count for b in bm.blocks) == held
    if sched.by_priority:  # both queues in (priority, arrival) order
        for queue in (sched.waiting, sched.running):
            keys = [(r.priority, r.arrival_time) for r in queue]
            assert keys == sorted(keys)


def update(sched: Scheduler, out: SchedulerOutput) -> list[Request]:
    """The engine's bookkeeping after a forward; returns the requests that finished."""
    finished = []
    for req, n in out.scheduled:
        req.num_computed_tokens += n
        sched.block_manager.cache_blocks(req)
        if req.num_computed_tokens >= req.num_tokens:
            req.append_token(FAKE_TOKEN)
            if req.num_output_tokens >= req.max_tokens:
                sched.finish(req, RequestStatus.FINISHED_LENGTH)
                finished.append(req)
    return finished


def step(sched: Scheduler) -> SchedulerOutput:
    out = sched.schedule()
    check_step(sched, out)
    update(sched, out)
    return out


def run_to_completion(sched: Scheduler, max_steps: int = 2000) -> list[SchedulerOutput]:
    outs = []
    while sched.has_unfinished():
        outs.append(step(sched))
        assert len(outs) < max_steps, "the scheduler made no progress"
    bm = sched.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)
    return outs


def scheduled_ids(out: SchedulerOutput) -> list[tuple[str, int]]:
    return [(r.request_id, n) for r, n in out.scheduled]


# ---- budget, chunking, admission ---------------------------------------------------------------
def test_token_budget_is_never_exceeded_and_everything_finishes():
    rng = random.Random(0)
    sched, bm = make_sched(num_blocks=256, budget=24, max_seqs=6, chunk=10)
    reqs = [make_req(f"r{i}", toks(i, rng.randint(1, 40)), rng.randint(1, 8)) for i in range(20)]
    add(sched, *reqs)
    outs = run_to_completion(sched)
    assert max(o.total_num_tokens for o in outs) == 24  # the budget was actually binding
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in reqs)
    assert all(r.num_output_tokens == r.max_tokens for r in reqs)
    assert all(r.num_computed_tokens == r.num_tokens - 1 for r in reqs)


def test_first_step_admits_fcfs_and_stops_at_the_budget():
    sched, _ = make_sched(budget=10, chunk=512)
    add(sched, make_req("a", toks(1, 4)), make_req("b", toks(2, 4)), make_req("c", toks(3, 4)))
    out = step(sched)
    assert scheduled_ids(out) == [("a", 4), ("b", 4), ("c", 2)]  # c gets a first chunk
    assert [r.request_id for r in sched.running] == ["a", "b", "c"]


def test_chunked_prefill_splits_a_long_prompt_and_mixes_with_decodes():
    sched, _ = make_sched(budget=16, chunk=8)
    a = make_req("a", toks(1, 3), max_tokens=10)
    add(sched, a)
    assert scheduled_ids(step(sched)) == [("a", 3)]
    b = make_req("b", toks(2, 20), max_tokens=2)
    add(sched, b)
    assert scheduled_ids(step(sched)) == [("a", 1), ("b", 8)]
    assert b.num_computed_tokens == 8 and b.num_output_tokens == 0
    assert scheduled_ids(step(sched)) == [("a", 1), ("b", 8)]
    assert scheduled_ids(step(sched)) == [("a", 1), ("b", 4)]
    assert b.num_output_tokens == 1  # the last chunk produced a token
    assert scheduled_ids(step(sched)) == [("a", 1), ("b", 1)]
    assert b.is_finished and not a.is_finished


def test_a_prompt_longer_than_the_budget_is_chunked_by_the_budget():
    sched, _ = make_sched(budget=16, chunk=512)
    r = make_req("r", toks(1, 50), max_tokens=1)
    add(sched, r)
    outs = run_to_completion(sched)
    assert [n for o in outs for _, n in o.scheduled] == [16, 16, 16, 2]


def test_fcfs_a_blocked_request_is_not_overtaken():
    sched, bm = make_sched(num_blocks=6, budget=100)
    a = make_req("a", toks(1, 12), max_tokens=1)  # 3 blocks
    b = make_req("b", toks(2, 16), max_tokens=1)  # 4 blocks: does not fit next to a
    c = make_req("c", toks(3, 2), max_tokens=1)  # 1 block: would fit, must wait behind b
    add(sched, a, b, c)
    assert scheduled_ids(step(sched)) == [("a", 12)]
    assert list(sched.waiting) == [b, c] and b.block_ids == [] and b.num_computed_tokens == 0
    assert scheduled_ids(step(sched)) == [("b", 16), ("c", 2)]
    assert not sched.has_unfinished() and bm.num_free_blocks == 6


def test_max_num_seqs_is_respected():
    sched, _ = make_sched(budget=100, max_seqs=2)
    reqs = [make_req(f"r{i}", toks(i, 3), max_tokens=3) for i in range(5)]
    add(sched, *reqs)
    out = step(sched)
    assert scheduled_ids(out) == [("r0", 3), ("r1", 3)]
    outs = [out, *run_to_completion(sched)]
    assert all(len(o.scheduled) <= 2 for o in outs)
    assert all(r.num_output_tokens == 3 for r in reqs)


def test_prefix_cache_hit_skips_the_cached_tokens():
    sched, _ = make_sched()
    a = make_req("a", toks(1, 10), max_tokens=3)
    add(sched, a)
    step(sched)
    b = make_req("b", toks(1, 8) + toks(2, 3), max_tokens=1)
    add(sched, b)
    out = sched.schedule()
    check_step(sched, out)
    assert scheduled_ids(out) == [("a", 1), ("b", 3)]
    assert b.num_cached_tokens == 8 and b.num_computed_tokens == 8
    assert b.block_ids[:2] == a.block_ids[:2]
    update(sched, out)
    run_to_completion(sched)


def _prefilled(outs: list[SchedulerOutput], req: Request) -> int:
    """Prompt tokens the scheduler had req compute over a run (recomputation included)."""
    return sum(n for o in outs for r, n in o.scheduled if r is req and n > 1)


@pytest.mark.parametrize("caching", [True, False])
def test_requests_arriving_with_a_long_shared_prefix_prefill_it_once(caching):
    shared = toks(9, 2 * MIN_SHARED_TOKENS_TO_WAIT)
    sched, bm = make_sched(num_blocks=1024, budget=128, chunk=64, caching=caching)
    a, b, c = (make_req(x, shared + toks(i, 6), max_tokens=2) for i, x in enumerate("abc"))
    add(sched, a, b, c)
    first = step(sched)
    if not caching:  # nothing to share: all three start at once, as before
        assert scheduled_ids(first) == [("a", 64), ("b", 64)]
        run_to_completion(sched)
        return
    # b and c wait while a prefills what they share, keeping their place in the queue.
    assert scheduled_ids(first) == [("a", 64)] and list(sched.waiting) == [b, c]
    outs = [first, *run_to_completion(sched)]
    assert _prefilled(outs, a) == len(a.prompt_token_ids)
    for r in (b, c):
        assert r.num_cached_tokens == len(shared)
        assert _prefilled(outs, r) == len(r.prompt_token_ids) - len(shared)
    # Once the shared blocks were computed, b and c were admitted in the same step.
    admitted = next(i for i, o in enumerate(outs) if b in [r for r, _ in o.scheduled])
    assert c in [r for r, _ in outs[admitted].scheduled]


def test_a_request_waiting_for_a_shared_prefix_lets_unrelated_ones_pass():
    sched, _ = make_sched(num_blocks=1024, budget=128, chunk=64)
    shared = toks(9, 2 * MIN_SHARED_TOKENS_TO_WAIT)
    a, b = make_req("a", shared + toks(1, 3)), make_req("b", shared + toks(2, 3))
    c = make_req("c", toks(3, 10))
    add(sched, a, b, c)
    assert scheduled_ids(step(sched)) == [("a", 64), ("c", 10)]
    assert list(sched.waiting) == [b]
    run_to_completion(sched)
    assert b.num_cached_tokens == len(shared)


def test_under_priority_a_shared_prefix_wait_lets_only_its_own_priority_pass():
    sched, _ = make_sched(num_blocks=1024, budget=128, chunk=64, policy="priority")
    shared = toks(9, 2 * MIN_SHARED_TOKENS_TO_WAIT)
    a, b = make_req("a", shared + toks(1, 3)), make_req("b", shared + toks(2, 3))
    c = make_req("c", toks(3, 10))  # as urgent as b: passes it, as under fcfs
    d = make_req("d", toks(4, 10), priority=5)  # less urgent: would take b's slot
    add(sched, a, b, c, d)
    assert scheduled_ids(step(sched)) == [("a", 64), ("c", 10)]
    assert list(sched.waiting) == [b, d]
    outs = run_to_completion(sched)
    admitted = {r.request_id: i for i, o in enumerate(outs) for r, _ in o.scheduled
                if r.request_id not in ("a", "c")}
    assert admitted["b"] <= admitted["d"] and b.num_cached_tokens == len(shared)


def test_under_priority_a_less_urgent_sharer_is_waited_for_only_while_it_runs():
    """The less urgent sharer may get no budget for as long as urgent requests fill it: an
    urgent request that shares its prefix waits for it only in a step where it is scheduled,
    and otherwise prefills the prefix itself."""
    sched, _ = make_sched(num_blocks=1024, budget=128, chunk=64, policy="priority")
    shared = toks(9, 2 * MIN_SHARED_TOKENS_TO_WAIT)
    slow = make_req("slow", shared + toks(1, 3), priority=5)
    add(sched, slow)
    assert scheduled_ids(step(sched)) == [("slow", 64)]
    urgent = make_req("urgent", shared + toks(2, 3))
    add(sched, urgent)
    assert scheduled_ids(step(sched)) == [("slow", 64)] and list(sched.waiting) == [urgent]
    unscheduled = {h: slow.priority for h in sched._uncomputed_prompt_blocks(slow)}
    assert not sched._waits_for_inflight(urgent, unscheduled)
    assert sched._waits_for_inflight(urgent, dict.fromkeys(unscheduled, -math.inf))


def test_a_wait_ends_when_the_request_it_waits_for_is_aborted():
    sched, _ = make_sched(num_blocks=1024, budget=128, chunk=64)
    shared = toks(9, 2 * MIN_SHARED_TOKENS_TO_WAIT)
    a, b = make_req("a", shared + toks(1, 3)), make_req("b", shared + toks(2, 3))
    add(sched, a, b)
    step(sched)
    step(sched)
    assert list(sched.waiting) == [b]
    sched.finish(a, RequestStatus.FINISHED_ABORTED)
    out = step(sched)  # b takes what a computed from the cache and prefills the rest itself
    assert scheduled_ids(out) == [("b", 64)] and b.num_cached_tokens == 128
    run_to_completion(sched)


def test_a_preempted_request_is_not_held_back():
    sched, _ = make_sched(num_blocks=1024, budget=128, chunk=64)
    shared = toks(9, 2 * MIN_SHARED_TOKENS_TO_WAIT)
    a, b = make_req("a", shared + toks(1, 3)), make_req("b", shared + toks(2, 3))
    add(sched, a)
    step(sched)
    b.status = RequestStatus.PREEMPTED  # as if it had run before and been preempted
    add(sched, b)
    assert scheduled_ids(step(sched)) == [("a", 64), ("b", 64)]
    run_to_completion(sched)


def test_the_wait_threshold_is_inclusive():
    sched, _ = make_sched(num_blocks=1024, budget=256, chunk=64)
    shared = toks(9, MIN_SHARED_TOKENS_TO_WAIT)  # exactly the threshold, whole blocks
    a, b = make_req("a", shared + toks(1, 40)), make_req("b", shared + toks(2, 40))
    add(sched, a, b)
    assert scheduled_ids(step(sched)) == [("a", 64)]


def test_a_short_shared_prefix_is_computed_again_rather_than_waited_for():
    """A chat template's common preamble is too short to be worth a step of latency."""
    sched, _ = make_sched(num_blocks=1024, budget=256, chunk=64)
    shared = toks(9, MIN_SHARED_TOKENS_TO_WAIT - 2 * BS)
    a, b = make_req("a", shared + toks(1, 40)), make_req("b", shared + toks(2, 40))
    add(sched, a, b)
    assert scheduled_ids(step(sched)) == [("a", 64), ("b", 64)]


def test_the_tail_of_a_shared_prefix_still_in_flight_is_waited_for():
    """b arrives while a prefills the last chunk of what they share, less than
    MIN_SHARED_TOKENS_TO_WAIT: b takes the computed blocks from the cache and waits for the rest
    rather than computing it a second time."""
    sched, _ = make_sched(num_blocks=1024, budget=128, chunk=64)  # room for b beside a's chunk
    shared = toks(9, 4 * MIN_SHARED_TOKENS_TO_WAIT)
    a, b = make_req("a", shared + toks(1, 3)), make_req("b", shared + toks(2, 3))
    add(sched, a)
    for _ in range((len(shared) - MIN_SHARED_TOKENS_TO_WAIT // 2) // 64):
        step(sched)
    add(sched, b)
    outs = run_to_completion(sched)
    assert b.num_cached_tokens == len(shared)
    assert _prefilled(outs, b) == len(b.prompt_token_ids) - len(shared)


def test_a_prefix_already_cached_is_not_waited_for_while_another_request_computes_it():
    """r was admitted before q registered the prefix they share and still prefills its own
    copy; d, arriving now, is served q's blocks at once instead of waiting for r."""
    sched, bm = make_sched(num_blocks=1024, budget=128, chunk=64)
    shared = toks(9, 2 * MIN_SHARED_TOKENS_TO_WAIT)
    q = make_req("q", shared + toks(1, 3))
    add(sched, q)
    while q.num_computed_tokens < len(shared):
        step(sched)
    r = make_req("r", shared + toks(2, 3))  # as if admitted before q's blocks were registered
    assert bm.allocate(r, 64)
    r.status = RequestStatus.RUNNING
    sched.running.append(r)
    d = make_req("d", shared + toks(3, 3))
    assert not sched._waits_for_inflight(d, sched._inflight_prompt_blocks(set()))


# ---- preemption --------------------------------------------------------------------------------
def test_preemption_evicts_the_last_admitted_and_puts_it_back_first():
    sched, _ = make_sched(num_blocks=5, budget=100, max_seqs=2)
    a = make_req("a", toks(1, 4), max_tokens=12)
    b = make_req("b", toks(2, 8), max_tokens=12)
    c = make_req("c", toks(3, 1), max_tokens=1)  # kept out by max_num_seqs until a slot opens
    add(sched, a, b, c)
    out = step(sched)
    while not out.preempted:
        assert [r.request_id for r in sched.running] == ["a", "b"]
        out = sched.schedule()
        check_step(sched, out)
        if not out.preempted:
            update(sched, out)
    assert out.preempted == [b] and sched.num_preemptions == 1
    assert scheduled_ids(out) == [("a", 1)]
    assert b.status == RequestStatus.PREEMPTED and b.num_preemptions == 1
    assert b.num_computed_tokens == 0 and b.block_ids == [] and b.spec_token_ids == []
    assert list(sched.waiting) == [b, c]  # back at the front, ahead of c
    assert sched.running == [a]
    update(sched, out)
    run_to_completion(sched)
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in (a, b, c))
    assert (a.num_output_tokens, b.num_output_tokens, c.num_output_tokens) == (12, 12, 1)


def test_nothing_is_admitted_in_a_step_with_preemption():
    # Without prefix caching and with 4-token chunks, the victim could be re-admitted at once
    # (its first chunk needs one block, and one is free after the preemption).
    sched, bm = make_sched(num_blocks=3, budget=100, chunk=4, caching=False)
    a = make_req("a", toks(1, 4), max_tokens=6)
    b = make_req("b", toks(2, 4), max_tokens=6)
    add(sched, a, b)
    assert scheduled_ids(step(sched)) == [("a", 4), ("b", 4)]
    out = sched.schedule()  # a takes the last block; b needs one more and preempts itself
    check_step(sched, out)
    assert out.preempted == [b] and scheduled_ids(out) == [("a", 1)]
    assert bm.num_free_blocks == 1
    assert list(sched.waiting) == [b] and sched.running == [a]
    assert b.status == RequestStatus.PREEMPTED and b.block_ids == []
    update(sched, out)
    out = step(sched)
    assert scheduled_ids(out) == [("a", 1), ("b", 4)]  # re-admitted next step, recomputed
    run_to_completion(sched)
    assert a.num_output_tokens == 6 and b.num_output_tokens == 6


def test_preemption_frees_the_victims_blocks_for_the_running_request():
    sched, bm = make_sched(num_blocks=4, budget=100)
    reqs = [make_req(f"r{i}", toks(i, 4), max_tokens=8) for i in range(4)]  # 1 block each
    add(sched, *reqs)
    step(sched)
    assert bm.num_free_blocks == 0
    out = sched.schedule()  # every request now needs a second block
    check_step(sched, out)
    # r0 takes r3's block, r1 takes r2's; r2 and r3 wait in admission order.
    assert scheduled_ids(out) == [("r0", 1), ("r1", 1)]
    assert out.preempted == [reqs[3], reqs[2]]
    assert list(sched.waiting) == [reqs[2], reqs[3]]
    assert all(r.status == RequestStatus.PREEMPTED for r in reqs[2:])
    update(sched, out)
    run_to_completion(sched)


def test_the_last_running_request_preempts_itself():
    sched, _ = make_sched(num_blocks=3, budget=100)
    a = make_req("a", toks(1, 2), max_tokens=4)  # 1 block, room to decode in it
    b = make_req("b", toks(2, 8), max_tokens=4)  # 2 blocks, needs a 3rd for its next token
    add(sched, a, b)
    step(sched)
    out = sched.schedule()
    check_step(sched, out)
    assert out.preempted == [b] and scheduled_ids(out) == [("a", 1)]
    assert b.status == RequestStatus.PREEMPTED and list(sched.waiting) == [b]
    assert sched.running == [a]
    update(sched, out)
    run_to_completion(sched)
    assert a.num_output_tokens == 4 and b.num_output_tokens == 4


def test_a_readmission_after_preemption_is_not_a_new_prefix_lookup():
    """Its own just-freed blocks would count as hits: the hit rate would rise exactly when the
    pool is short."""
    sched, bm = make_sched(budget=100)
    a = _decoding(sched, "a", 3 * BS)
    queries, hits = bm.num_prefix_queries, bm.num_prefix_hits
    sched.running.remove(a)
    sched._preempt(a)
    out = step(sched)
    assert scheduled_ids(out) == [("a", 1)]  # its 3 blocks served from the cache
    assert (bm.num_prefix_queries, bm.num_prefix_hits) == (queries, hits)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("caching", [True, False])
def test_random_workload_under_memory_pressure_finishes(caching, policy):
    rng, urgency = random.Random(7), random.Random(8)
    sched, bm = make_sched(num_blocks=12, budget=20, max_seqs=5, chunk=8, caching=caching,
                           policy=policy)
    shared = toks(99, 8)
    reqs = []
    for i in range(25):
        prompt = (shared if rng.random() < 0.5 else []) + toks(i, rng.randint(1, 12))
        reqs.append(make_req(f"r{i}", prompt, max_tokens=rng.randint(1, 16),
                             priority=urgency.randint(-2, 2)))
    add(sched, *reqs)
    outs = run_to_completion(sched, max_steps=3000)
    assert sched.num_preemptions > 0  # the pool really was short
    assert sum(len(o.preempted) for o in outs) == sched.num_preemptions
    assert all(r.num_output_tokens == r.max_tokens for r in reqs)
    assert sched.running == [] and not sched.waiting
    if not caching:
        assert bm.num_prefix_queries == 0


# ---- priority scheduling -----------------------------------------------------------------------
def test_priority_admits_the_most_urgent_first_then_by_arrival():
    sched, _ = make_sched(budget=100, max_seqs=2, policy="priority")
    a, b, c, d = (make_req(rid, toks(i, 4), max_tokens=1, priority=p)
                  for i, (rid, p) in enumerate([("a", 1), ("b", 0), ("c", 1), ("d", 0)]))
    add(sched, a, b, c, d)
    assert list(sched.waiting) == [b, d, a, c]
    assert scheduled_ids(step(sched)) == [("b", 4), ("d", 4)]
    assert scheduled_ids(step(sched)) == [("a", 4), ("c", 4)]


def test_fcfs_ignores_priorities():
    sched, _ = make_sched(budget=100, max_seqs=2)
    add(sched, *(make_req(rid, toks(i, 4), max_tokens=1, priority=p)
                 for i, (rid, p) in enumerate([("a", 1), ("b", 0), ("c", 1), ("d", 0)])))
    assert scheduled_ids(step(sched)) == [("a", 4), ("b", 4)]


def test_priority_preempts_the_least_urgent_not_the_last_admitted():
    """Under fcfs b, admitted last, would be the victim (the test above of that policy)."""
    sched, _ = make_sched(num_blocks=5, budget=100, max_seqs=2, policy="priority")
    a = make_req("a", toks(1, 4), max_tokens=12, priority=5)
    b = make_req("b", toks(2, 8), max_tokens=12, priority=0)
    add(sched, a)
    step(sched)
    add(sched, b)  # arrives after a is running, more urgent
    out = step(sched)
    assert sched.running == [b, a]  # b gets the budget first
    c = make_req("c", toks(3, 1), max_tokens=1, priority=-1)  # kept out by max_num_seqs
    add(sched, c)
    while not out.preempted:
        out = sched.schedule()
        check_step(sched, out)
        if not out.preempted:
            update(sched, out)
    assert out.preempted == [a] and scheduled_ids(out) == [("b", 1)]
    assert list(sched.waiting) == [c, a]  # a goes back behind the more urgent c
    update(sched, out)
    run_to_completion(sched)
    assert (a.num_preemptions, b.num_preemptions) == (1, 0)
    assert (a.num_output_tokens, b.num_output_tokens, c.num_output_tokens) == (12, 12, 1)


def test_an_unknown_scheduling_policy_is_refused():
    with pytest.raises(ValueError, match="scheduling_policy"):
        SchedulerConfig(scheduling_policy="lifo")


def test_a_request_that_cannot_fit_an_empty_pool_raises():
    sched, _ = make_sched(num_blocks=2, budget=100)
    add(sched, make_req("big", toks(1, 3 * BS)))
    with pytest.raises(RuntimeError, match="big"):
        sched.schedule()


# ---- speculative tokens ------------------------------------------------------------------------
def _decoding(sched: Scheduler, rid: str, n_prompt: int) -> Request:
    r = make_req(rid, toks(len(sched.running) + 1, n_prompt), max_tokens=50)
    add(sched, r)
    step(sched)
    assert r.num_computed_tokens == r.num_tokens - 1
    return r


def test_spec_tokens_are_scheduled_with_the_decode_token():
    sched, bm = make_sched(budget=100)
    r = _decoding(sched, "r", 3)  # 4 tokens known, 3 computed
    r.spec_token_ids = [1, 2, 3, 4, 5]
    out = sched.schedule()
    assert scheduled_ids(out) == [("r", 6)]
    assert len(r.block_ids) * BS >= r.num_tokens + 5
    assert r.spec_token_ids == [1, 2, 3, 4, 5]


def test_spec_tokens_are_capped_by_the_budget():
    sched, _ = make_sched(budget=4)
    r = _decoding(sched, "r", 3)
    r.spec_token_ids = [1, 2, 3, 4, 5]
    assert scheduled_ids(sched.schedule()) == [("r", 4)]


def test_drafts_leave_a_decode_token_for_every_request_behind():
    """With a budget the drafts alone could fill, the front requests' drafts used it up every
    step: the requests behind kept their unverified drafts, were never proposed for again, and
    got no token until the front ones finished. Now each request behind keeps its decode
    token; the drafts share what is left, front first."""
    sched, _ = make_sched(budget=16)
    reqs = [_decoding(sched, f"r{i}", 3) for i in range(8)]  # 8 decoding requests
    for r in reqs:
        r.spec_token_ids = [1, 2, 3, 4]
    out = sched.schedule()
    assert [n for _, n in out.scheduled] == [5, 5, 1, 1, 1, 1, 1, 1]  # 16 = 8 + 8 drafts
    assert out.total_num_tokens == 16


def test_spec_tokens_of_an_unfinished_prefill_are_dropped():
    sched, _ = make_sched(budget=100, chunk=4)
    r = make_req("r", toks(1, 10))
    add(sched, r)
    step(sched)
    r.spec_token_ids = [1, 2]
    out = sched.schedule()
    assert scheduled_ids(out) == [("r", 4)]
    assert r.spec_token_ids == []


def test_preemption_drops_spec_tokens():
    sched, _ = make_sched(num_blocks=2, budget=100)
    a = _decoding(sched, "a", 3)  # 1 block
    b = _decoding(sched, "b", 3)  # 1 block; a decoded a token beside it: its next needs a 2nd
    b.spec_token_ids = [1, 2]
    a.spec_token_ids = [1]
    out = sched.schedule()  # b is preempted for a's decode token; a's draft fits beside it
    assert out.preempted == [b] and scheduled_ids(out) == [("a", 2)]
    assert b.spec_token_ids == [] and b.block_ids == []


def test_drafts_are_dropped_before_anyone_is_preempted():
    """Drafts that need a block the pool does not have are not verified this step; no request
    loses its KV for them, not even the one that drafted (its decode token fits). It keeps
    its drafts: the engine rolls the proposer back when none was verified."""
    sched, bm = make_sched(num_blocks=2, budget=100)
    a = _decoding(sched, "a", 2)  # 1 block; after b's step its decode token fits, a draft not
    b = _decoding(sched, "b", 3)  # 1 block, the last one
    a.spec_token_ids, b.spec_token_ids = [1], [1, 2]
    out = sched.schedule()
    assert out.preempted == [] and scheduled_ids(out) == [("a", 1), ("b", 1)]
    assert a.spec_token_ids == [1] and bm.num_free_blocks == 0


def test_drafts_take_no_block_a_request_behind_needs():
    """a's drafts would fit in the last free block, which b needs for its decode token: a
    verifies nothing this step and nobody is preempted (before, b lost its KV for a's guess)."""
    sched, bm = make_sched(num_blocks=4, budget=100)
    a = _decoding(sched, "a", 2 * BS - 2)  # 2 blocks; its next decode token fits, drafts not
    _decoding(sched, "b", BS)  # 1 block, full: its decode token needs a new one
    assert bm.num_free_blocks == 1
    a.spec_token_ids = [1, 2, 3]
    out = sched.schedule()
    check_step(sched, out)
    assert out.preempted == [] and scheduled_ids(out) == [("a", 1), ("b", 1)]


def test_drafts_still_take_blocks_nobody_needs():
    sched, bm = make_sched(num_blocks=5, budget=100)
    a = _decoding(sched, "a", 2 * BS - 2)
    _decoding(sched, "b", BS)
    a.spec_token_ids = [1, 2, 3]
    out = sched.schedule()
    assert out.preempted == [] and scheduled_ids(out) == [("a", 4), ("b", 1)]


# ---- finish / abort ----------------------------------------------------------------------------
def test_finish_removes_a_waiting_or_running_request():
    sched, bm = make_sched(budget=100, max_seqs=1)
    a = make_req("a", toks(1, 5))
    b = make_req("b", toks(2, 5))
    add(sched, a, b)
    step(sched)
    sched.finish(b, RequestStatus.FINISHED_ABORTED)
    assert list(sched.waiting) == [] and b.finish_reason == "abort"
    sched.finish(a, RequestStatus.FINISHED_ABORTED)
    assert sched.running == [] and not sched.has_unfinished()
    assert bm.num_free_blocks == bm.num_blocks
