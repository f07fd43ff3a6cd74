"""Priority scheduling (vLLM's `scheduling_policy="priority"` and request `priority`) on the real
model: who is admitted first and who is preempted change, the tokens do not; the offline API and
a live server take the field. The scheduler's own rules are unit-tested in test_scheduler.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from test_server import MODEL, MODEL_FLAGS, LiveServer, kv_pool_is_free, wait_until

from specserve import LLM, SamplingParams

PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "SELECT name FROM users"]
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def expected(llm) -> list[str]:
    """Each prompt's greedy text from the shared first-come-first-served engine."""
    return [o.outputs[0].text for o in llm.generate(PROMPTS, GREEDY)]


def run(engine, priorities: list[int]) -> tuple[list[str], list, list[str]]:
    """Add every prompt at once with its priority and step to the end: the order requests
    finished in, the Request objects and their texts."""
    reqs = [engine.add_request(p, GREEDY, request_id=f"r{i}", priority=prio)
            for i, (p, prio) in enumerate(zip(PROMPTS, priorities, strict=True))]
    finished, texts = [], {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished.append(out.request_id)
                texts[out.request_id] = out.outputs[0].text
    return finished, reqs, [texts[r.request_id] for r in reqs]


def test_one_slot_serves_the_most_urgent_first(expected):
    engine = LLM(dtype="float32", scheduling_policy="priority", max_num_seqs=1).engine
    finished, _, texts = run(engine, [2, 0, 1])
    assert finished == ["r1", "r2", "r0"]
    assert texts == expected


def test_a_short_pool_preempts_the_least_urgent(expected):
    """Three 40-token replies in a pool of ~6 blocks: requests are preempted. Under equal
    priorities the victim is the latest arrival; given the first place, that same request is
    never preempted, and every text stays the greedy one."""
    engine = LLM(dtype="float32", scheduling_policy="priority", kv_cache_memory="4MiB",
                 enable_prefix_caching=False).engine
    assert engine.block_manager.num_blocks * engine.block_manager.block_size < 3 * 50
    _, reqs, texts = run(engine, [0, 0, 0])
    assert reqs[2].num_preemptions > 0 and texts == expected
    _, reqs, texts = run(engine, [0, 0, -1])
    assert reqs[2].num_preemptions == 0 and sum(r.num_preemptions for r in reqs) > 0
    assert texts == expected


def test_the_offline_api_takes_one_priority_per_prompt(llm, expected):
    engine = LLM(dtype="float32", scheduling_policy="priority", max_num_seqs=1)
    outs = engine.generate(PROMPTS, GREEDY, priority=[1, 0, 2])
    assert [o.outputs[0].text for o in outs] == expected  # input order, whatever ran first
    with pytest.raises(ValueError, match="one priority per prompt"):
        engine.generate(PROMPTS, GREEDY, priority=[1])
    # The shared engine schedules first come, first served: a priority would mean nothing.
    with pytest.raises(ValueError, match="priority scheduling"):
        llm.generate(PROMPTS, GREEDY, priority=[0, 1, 0])
    assert not llm.engine.has_unfinished_requests()  # all or none: nothing was queued


# ---- the server ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    live = LiveServer(*MODEL_FLAGS, "--scheduling-policy", "priority", "--max-num-seqs", "1")
    yield live
    live.stop()


BODIES = {  # each endpoint's request for a text, without its priority
    "completions": lambda text: {"prompt": text, "max_tokens": 32},
    "chat/completions": lambda text: {"messages": [{"role": "user", "content": text}],
                                      "max_tokens": 32},
    "responses": lambda text: {"input": text, "max_output_tokens": 32},
}


@pytest.mark.parametrize("endpoint", list(BODIES))
def test_the_server_admits_the_most_urgent_waiting_request_first(server: LiveServer,
                                                                endpoint: str):
    """One slot, held by a long stream. Two requests wait behind it, the more urgent sent
    last; once the stream is closed (aborting its request), the urgent one runs first. The
    server queues commands to the engine in order, so both are queued before the abort."""
    done: dict[str, float] = {}

    def post(name: str, priority: int) -> None:
        reply = httpx.post(f"{server.url}/v1/{endpoint}", timeout=120, json={
            "model": MODEL, "ignore_eos": True, "temperature": 0, "priority": priority,
            **BODIES[endpoint](f"Request {name} says")})
        assert reply.status_code == 200, reply.text
        done[name] = time.monotonic()

    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=120, json={
            "model": MODEL, "prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True,
            "stream": True, "priority": 5}) as holder:
        lines = holder.iter_lines()  # kept: a dropped iterator closes the response
        next(lines)  # it runs
        threads = [threading.Thread(target=post, args=("late", 3)),
                   threading.Thread(target=post, args=("urgent", -1))]
        for t in threads:
            t.start()
            in_flight = threads.index(t) + 2
            assert wait_until(lambda n=in_flight: server.stats()["num_requests_in_flight"] == n)
    for t in threads:
        t.join()
    assert done["urgent"] < done["late"]
    assert wait_until(lambda: kv_pool_is_free(server))


def test_chat_and_responses_take_a_priority(server: LiveServer):
    chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
        "priority": -2})
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"]
    resp = httpx.post(f"{server.url}/v1/responses", timeout=60, json={
        "model": MODEL, "input": "Hi", "max_output_tokens": 4, "priority": 7})
    assert resp.status_code == 200 and resp.json()["status"] in ("completed", "incomplete")
    wrong = httpx.post(f"{server.url}/v1/responses", timeout=60, json={
        "model": MODEL, "input": "Hi", "priority": 1.5})
    assert wrong.status_code == 400 and "priority" in wrong.text
