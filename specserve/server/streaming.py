"""How responses go out: server-sent events ending in `data: [DONE]`, or the Responses API's
typed events (an error in-band when the engine aborts, or on a bug of ours), the per-token
chunk rendered from a template, what each choice has sent so far,
where each token starts in a completion's text, and a non-streamed response's wait for its
outputs that watches for the client hanging up."""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from specserve.outputs import CompletionOutput, RequestOutput
from specserve.server.async_engine import EngineDeadError, OutputStream, RequestAborted
from specserve.server.errors import APIError, error_body

logger = logging.getLogger("specserve")


class TextOffsets:
    """Where each token of a choice starts in its text, in characters (OpenAI's text_offset). A
    token that holds part of a UTF-8 character adds nothing until a later one completes it."""

    def __init__(self) -> None:
        self.chars = 0
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, raw: bytes) -> int:
        start = self.chars
        self.chars += len(self._utf8.decode(raw))
        return start


class DeltaTracker:
    """What each choice has sent so far. While a stop string could still match, the last
    len(stop) - 1 characters are held back: the engine cuts the text where the match begins,
    which can lie in text an earlier step already produced."""

    def __init__(self, num_choices: int, stop: str | list[str] | None):
        stops = [stop] if isinstance(stop, str) else (stop or [])
        self.holdback = max((len(s) for s in stops), default=1) - 1
        self.sent_chars = [0] * num_choices
        self.sent_tokens = [0] * num_choices
        self.text_offsets = [TextOffsets() for _ in range(num_choices)]  # completion logprobs

    def text(self, i: int, text: str, finished: bool) -> str:
        start, end = self.sent_chars[i], len(text) if finished else len(text) - self.holdback
        if end <= start:
            return ""
        self.sent_chars[i] = end
        return text[start:end]

    def tokens(self, i: int, c: CompletionOutput) -> tuple[list[int], list[dict] | None]:
        start = self.sent_tokens[i]
        self.sent_tokens[i] = len(c.token_ids)
        return c.token_ids[start:], None if c.logprobs is None else c.logprobs[start:]


class TextChunk:
    """The JSON of a streamed chunk that carries only new text (the chunk sent for nearly every
    token), rendered from the response's own pydantic model once per choice: the model is
    dumped with a placeholder text, and each token's chunk is that JSON with the placeholder
    replaced. ~0.5 µs per chunk against ~6 µs for building and dumping the models, on the
    thread that also carries every other stream. With continuous usage stats, the model's
    `"usage":null` (its last field, after the text) is replaced too."""

    _PLACEHOLDER = "\x00specserve-text\x00"
    _NO_USAGE = '"usage":null'

    def __init__(self, make: Callable[[int, str], BaseModel]):
        self._make = make
        # index -> (head, tail, tail before usage, tail after usage)
        self._templates: dict[int, tuple[str, str, str, str]] = {}

    def render(self, index: int, text: str, num_tokens: tuple[int, int] | None = None) -> str:
        """num_tokens: (prompt, completion) tokens so far, to send as usage; None: no usage."""
        template = self._templates.get(index)
        if template is None:
            dumped = self._make(index, self._PLACEHOLDER).model_dump_json()
            head, tail = dumped.split(json.dumps(self._PLACEHOLDER))
            before, found, after = tail.rpartition(self._NO_USAGE)
            assert found, "the chunk model's last field must be usage"
            template = self._templates[index] = (head, tail, before, after)
        if num_tokens is None:
            return template[0] + json.dumps(text, ensure_ascii=False) + template[1]
        prompt, completion = num_tokens
        usage = (f'"usage":{{"prompt_tokens":{prompt},"completion_tokens":{completion},'
                 f'"total_tokens":{prompt + completion}}}')
        return (template[0] + json.dumps(text, ensure_ascii=False) + template[2] + usage
                + template[3])


class EventStreamResponse(StreamingResponse):
    """Server-sent events ending with `data: [DONE]`, or typed ones (the Responses API's:
    `event: TYPE` before each, no [DONE]). However the response ends (finished, client gone,
    server stopping) the engine requests behind it are aborted at once."""

    def __init__(self, events: AsyncIterator[BaseModel | str | dict], stream: OutputStream,
                 typed: bool = False):
        super().__init__(_typed_sse(events) if typed else _sse(events),
                         media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._stream.close()


async def _sse(events: AsyncIterator[BaseModel | str]) -> AsyncIterator[str]:
    try:
        async for event in events:
            yield f"data: {event if isinstance(event, str) else event.model_dump_json()}\n\n"
    except (RequestAborted, EngineDeadError) as exc:
        # The status line is long gone: report the failure in-band, as OpenAI does.
        yield f"data: {json.dumps(error_body(503, str(exc)))}\n\n"
    except Exception:  # our bug: logged, and the client still gets an end to the stream
        logger.exception("a streamed response failed")
        yield f"data: {json.dumps(error_body(500, 'internal server error'))}\n\n"
    yield "data: [DONE]\n\n"


async def _typed_sse(events: AsyncIterator[dict]) -> AsyncIterator[str]:
    sequence = 0
    try:
        async for event in events:
            sequence = event["sequence_number"] + 1
            yield f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
    except (RequestAborted, EngineDeadError) as exc:
        # The Responses API's error event (the status line is long gone).
        yield _error_event(str(exc), sequence)
    except Exception:  # our bug: logged, and the client still gets an end to the stream
        logger.exception("a streamed response failed")
        yield _error_event("internal server error", sequence)


def _error_event(message: str, sequence: int) -> str:
    error = {"type": "error", "code": "server_error", "message": message, "param": None,
             "sequence_number": sequence}
    return f"event: error\ndata: {json.dumps(error)}\n\n"


async def collect_outputs(stream: OutputStream, raw: Request) -> list[RequestOutput] | None:
    """The final output of every choice, or None if the client hung up first (then the engine
    requests are aborted at once rather than generating for nobody)."""
    final: list[RequestOutput | None] = [None] * len(stream.request_ids)

    async def drain() -> None:
        async for i, out in stream:
            final[i] = out

    work = asyncio.ensure_future(drain())
    hangup = asyncio.ensure_future(_wait_for_disconnect(raw))
    try:
        await asyncio.wait((work, hangup), return_when=asyncio.FIRST_COMPLETED)
    finally:
        hangup.cancel()
        work.cancel()  # a no-op when it is done
        stream.close()
    if not work.done() or work.cancelled():
        return None
    try:
        work.result()
    except (RequestAborted, EngineDeadError) as exc:
        raise APIError(503, str(exc)) from exc
    return final


async def _wait_for_disconnect(raw: Request) -> None:
    # The body has been read, so the next ASGI message is the disconnect (or, after the
    # response, a disconnect too; by then nobody waits for this).
    while (await raw.receive())["type"] != "http.disconnect":
        pass
