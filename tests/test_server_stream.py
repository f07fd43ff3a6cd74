"""The server's streaming hot path: the per-token chunk template and the OutputStream hand-off
(without a model), and the engine thread's stream interval and lifetime (with one)."""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace

import pytest

from specserve import SamplingParams
from specserve.outputs import CompletionOutput, RequestOutput
from specserve.server.async_engine import IDLE_WAKE_S, AsyncEngine, OutputStream
from specserve.server.protocol import (
    ChatCompletionChunk,
    ChatStreamChoice,
    CompletionChoice,
    CompletionResponse,
    DeltaMessage,
)
from specserve.server.streaming import TextChunk

TEXTS = ["", " the", 'say "hi"', "back\\slash", "line\nbreak\ttab\r", "\x00\x01\x1f\x7f",
         "héllo wörld", "中文", "emoji 🚀", "\u2028\u2029", "</script>", "{\"a\": [1]}"]


def _chat(i: int, text: str) -> ChatCompletionChunk:
    choice = ChatStreamChoice(index=i, delta=DeltaMessage(content=text))
    return ChatCompletionChunk(id="chatcmpl-x", created=1, model="m", choices=[choice])


def _completion(i: int, text: str) -> CompletionResponse:
    return CompletionResponse(id="cmpl-x", created=1, model="m",
                              choices=[CompletionChoice(index=i, text=text)])


@pytest.mark.parametrize("make", [_chat, _completion])
def test_text_chunk_template_equals_the_pydantic_model(make):
    chunk = TextChunk(make)
    for index in (0, 3):
        for text in TEXTS:
            rendered = chunk.render(index, text)
            assert json.loads(rendered) == json.loads(make(index, text).model_dump_json()), text


def _output(rid: str, text: str, finished: bool = False) -> RequestOutput:
    return RequestOutput(rid, None, [1], [CompletionOutput(0, text, [0] * len(text))], finished)


def test_output_stream_delivers_in_order_and_supersedes_unread_outputs():
    async def run() -> list[tuple[int, str]]:
        owner = SimpleNamespace(_loop=asyncio.get_running_loop(), _observer=None,
                                _release=lambda n: None, _submit=lambda cmd: None)
        stream = OutputStream(owner, ["a", "b"], 0.0)
        got = []

        async def consume():
            async for i, out in stream:
                got.append((i, out.outputs[0].text))

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0)  # the consumer now waits
        stream._put(0, _output("a", "x"), 0.0)
        await asyncio.sleep(0)
        # The consumer falls behind: each choice's unread outputs collapse into its latest
        # (outputs carry the text so far), in the order the choices first had one waiting,
        # also when the choices alternate (n choices do, at every step).
        stream._put(0, _output("a", "xy"), 0.0)
        stream._put(0, _output("a", "xyz"), 0.0)
        stream._put(1, _output("b", "p"), 0.0)
        stream._put(0, _output("a", "xyzw", finished=True), 0.0)
        stream._put(1, _output("b", "pq", finished=True), 0.0)
        assert len(stream._items) == 2
        await asyncio.wait_for(task, 5)
        return got

    assert asyncio.run(run()) == [(0, "x"), (0, "xyzw"), (1, "pq")]


@pytest.mark.parametrize("interval", [1, 3])
def test_stream_interval_holds_outputs_back_and_loses_nothing(llm, interval):
    """The engine thread hands outputs over every `interval` steps, except a first token and a
    finished request, which go at once; every hand-off carries everything so far, so the
    streamed text is the offline engine's. The metrics still get one inter-token latency per
    engine step: a hand-off carries the gaps of every step it held back."""
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = ["The capital of France is", "def fibonacci(n):"]
    want = [o.outputs[0].text for o in llm.generate(prompts, params)]
    gaps: dict[str, list[float]] = {}
    firsts: dict[str, list[bool]] = {}

    async def run() -> tuple[dict[str, list[int]], list[str]]:
        handed: dict[str, list[int]] = {}  # request -> tokens so far at each hand-off

        def observe(out, first: bool) -> None:
            handed.setdefault(out.request_id, []).append(len(out.outputs[0].token_ids))
            gaps.setdefault(out.request_id, []).extend(out.metrics.inter_token_latencies)
            firsts.setdefault(out.request_id, []).append(first)
        engine = AsyncEngine(llm.engine, observer=observe, stream_interval=interval)
        engine.start()
        try:
            stream = await engine.add_requests(["s0", "s1"], prompts, [params] * 2, stream=True)
            texts = ["", ""]
            async for i, out in stream:
                texts[i] = out.outputs[0].text
            return handed, texts
        finally:
            await engine.shutdown()

    handed, texts = asyncio.run(run())
    assert texts == want
    for counts in handed.values():
        assert counts[0] == 1 and counts[-1] == 16
        if interval == 1:
            assert counts == list(range(1, 17))
        else:  # after the first token, one hand-off per `interval` steps, the last at once
            assert counts == [1, 4, 7, 10, 13, 16]
    for rid, got in gaps.items():
        assert len(got) == 15 and all(g > 0 for g in got), rid  # 16 tokens, one per step
        assert firsts[rid] == [True] + [False] * (len(firsts[rid]) - 1)


def test_stream_interval_must_be_positive(llm):
    with pytest.raises(ValueError, match="stream_interval"):
        AsyncEngine(llm.engine, stream_interval=0)


def test_the_engine_loop_stops_once_the_http_thread_is_gone(llm):
    """`specserve serve` runs the engine loop in the main thread and HTTP in another. An idle
    loop keeps waiting while the HTTP thread lives, and returns once it is gone, so that a dead
    HTTP thread ends the process instead of leaving one that looks up and serves nothing."""
    engine = AsyncEngine(llm.engine, own_thread=False)
    http_alive = threading.Event()
    http_alive.set()
    loop = asyncio.new_event_loop()
    loop.call_soon(engine.start)
    http = threading.Thread(target=loop.run_forever, daemon=True)
    http.start()
    engine_loop = threading.Thread(target=engine.run_in_current_thread,
                                   kwargs={"is_alive": http_alive.is_set}, daemon=True)
    engine_loop.start()
    try:
        engine_loop.join(timeout=3 * IDLE_WAKE_S)
        assert engine_loop.is_alive()  # idle, with HTTP up: still serving
        http_alive.clear()
        engine_loop.join(timeout=10)
        assert not engine_loop.is_alive()
        assert not engine.accepting
    finally:
        loop.call_soon_threadsafe(loop.stop)
        http.join(timeout=10)
        loop.close()


def test_completion_max_tokens_null_is_the_rest_of_the_context():
    """Absent, a completion's max_tokens is OpenAI's 16; null is vLLM's "the rest of the
    context" (null took the default of 16, as for fields where null means "not set")."""
    from specserve.server.protocol import CompletionRequest

    def parse(**body):
        return CompletionRequest.model_validate({"model": "m", "prompt": "x", **body})

    assert parse().max_tokens == 16
    assert parse(max_tokens=None).to_sampling_params(None, None,
                                                     SamplingParams()).max_tokens is None
    assert parse(n=None).n == 1  # other fields: null is still their default
    assert parse().add_special_tokens and not parse(add_special_tokens=False).add_special_tokens


def test_a_request_silent_on_sampling_takes_the_models_defaults():
    """The server fills what a request leaves unset from the engine's defaults (the model's
    generation_config.json); whatever the request sets, 0 and null-free values included,
    wins."""
    from specserve.server.protocol import ChatCompletionRequest

    defaults = SamplingParams(temperature=0.6, top_p=0.9, top_k=20, repetition_penalty=1.05)

    def params(**body):
        req = ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body})
        p = req.to_sampling_params(None, None, defaults)
        return p.temperature, p.top_p, p.top_k, p.repetition_penalty

    assert params() == (0.6, 0.9, 20, 1.05)
    assert params(temperature=0.0, top_k=0) == (0.0, 0.9, 0, 1.05)
    assert params(top_p=1.0, repetition_penalty=1.0, temperature=None) == (0.6, 1.0, 20, 1.0)


def test_a_full_server_refuses_a_structured_request_before_compiling_it(llm, monkeypatch):
    """Over its queue the server answers at once: its place is taken before its grammar
    compiles, and one that cannot get a place compiles nothing (a burst of large schemas would
    otherwise keep the worker thread busy for requests that are then refused)."""
    import asyncio

    from specserve import StructuredOutputsParams
    from specserve.server.async_engine import AsyncEngine, QueueFullError

    engine = AsyncEngine(llm.engine, max_queue=0, own_thread=False)
    engine._started.set()  # as if its loop ran (none is needed to refuse)
    engine._num_in_flight = engine.max_in_flight  # full
    monkeypatch.setattr(llm.engine, "compile_grammar",
                        lambda params: pytest.fail("compiled for a refused request"))
    params = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(
        choice=["yes", "no"]))
    with pytest.raises(QueueFullError):
        asyncio.run(engine.add_requests(["r0"], ["Is it?"], [params]))
    assert engine._num_in_flight == engine.max_in_flight  # nothing taken, nothing leaked
