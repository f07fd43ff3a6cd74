"""The server's streaming hot path, without a model: the per-token chunk template and the
OutputStream hand-off."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from specserve.outputs import CompletionOutput, RequestOutput
from specserve.server.async_engine import OutputStream
from specserve.server.protocol import (
    ChatCompletionChunk,
    ChatStreamChoice,
    CompletionChoice,
    CompletionResponse,
    DeltaMessage,
)
from specserve.server.serving import _TextChunk

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
    chunk = _TextChunk(make)
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
        stream = OutputStream(owner, ["a", "b"])
        got = []

        async def consume():
            async for i, out in stream:
                got.append((i, out.outputs[0].text))

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0)  # the consumer now waits
        stream._put(0, _output("a", "x"), 0.0)
        await asyncio.sleep(0)
        # The consumer falls behind: a's two outputs in a row collapse into the later one
        # (outputs carry the text so far); b's in between keep their order.
        stream._put(0, _output("a", "xy"), 0.0)
        stream._put(0, _output("a", "xyz"), 0.0)
        stream._put(1, _output("b", "p"), 0.0)
        stream._put(0, _output("a", "xyzw", finished=True), 0.0)
        stream._put(1, _output("b", "pq", finished=True), 0.0)
        await asyncio.wait_for(task, 5)
        return got

    assert asyncio.run(run()) == [(0, "x"), (0, "xyz"), (1, "p"), (0, "xyzw"), (1, "pq")]
