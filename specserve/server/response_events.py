"""The Responses API's answer (responses.py reads its request): a reply as output items
(reasoning, a message, function calls) in a Response object, whole or as the API's typed
stream events, both built by one event machine so that they agree."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from specserve.outputs import RequestOutput
from specserve.server.async_engine import OutputStream
from specserve.server.replies import ReplyReader
from specserve.server.responses import NamedFunction, ResponsesRequest
from specserve.server.streaming import DeltaTracker
from specserve.server.tool_calls import CallDelta, new_id


# ---- the response ------------------------------------------------------------------------------
def response_object(response_id: str, created: float, model: str, req: ResponsesRequest,
                    output: list[dict], usage: dict | None = None,
                    incomplete_reason: str | None = None, done: bool = False) -> dict[str, Any]:
    """The Response object, with the request's settings echoed as OpenAI echoes them."""
    tool_choice = (req.tool_choice.model_dump() if isinstance(req.tool_choice, NamedFunction)
                   else req.tool_choice or "auto")
    status = ("incomplete" if incomplete_reason else "completed") if done else "in_progress"
    return {
        "id": response_id, "object": "response", "created_at": created, "model": model,
        "status": status, "output": output, "usage": usage, "error": None,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {}, "parallel_tool_calls": req.parallel_tool_calls,
        "temperature": req.temperature, "top_p": req.top_p, "tool_choice": tool_choice,
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()],
        "text": {"format": (req.text.format.model_dump(by_alias=True, exclude_none=True)
                            if req.text and req.text.format else {"type": "text"})},
        "store": False, "previous_response_id": None, "reasoning": None, "user": req.user,
        "completed_at": time.time() if done else None,
    }


def response_usage(out: RequestOutput, cache_block: int | None,
                   reasoning_tokens: int) -> dict[str, Any]:
    """The Responses API's usage. cache_block: the prefix cache's block size (None: no prefix
    cache). cache_write_tokens: the prompt's full blocks not read from the cache, each of
    which the engine registers in it (at most: a request running beside it may have
    registered the same block first)."""
    prompt, completion = len(out.prompt_token_ids), len(out.outputs[0].token_ids)
    cached = out.metrics.num_cached_tokens if out.metrics is not None else 0
    written = 0 if cache_block is None else max(0, prompt // cache_block * cache_block - cached)
    return {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, completion)},
            "total_tokens": prompt + completion}


def _opened(kind: str, item_id: str) -> dict[str, Any]:
    """An output item as it opens: a reasoning item or an assistant message, still empty."""
    item = {"type": kind, "id": item_id, "status": "in_progress", "content": []}
    return item | ({"summary": []} if kind == "reasoning" else {"role": "assistant"})


def _part(kind: str, text: str) -> dict[str, Any]:
    """The content part of a reasoning item or a message."""
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


# ---- the events ----------------------------------------------------------------------------------
class ResponseEvents:
    """The API's typed events for one reply: the response created, then each output item
    opened (`output_item.added`, its content part), grown (`*.delta`), closed (`*.done`) in
    the order the reply writes them (reasoning, message, function calls), then the response
    completed (or incomplete). A whole reply is fed once: it ends with the same Response."""

    def __init__(self, response_id: str, model: str, req: ResponsesRequest,
                 cache_block: int | None, count_tokens: Callable[[str], int] | None = None):
        """count_tokens: a text's tokens, for the reasoning's in usage when finish is not
        given their count (the server counts them off the event loop: serving.responses)."""
        self.response_id, self.model, self.req = response_id, model, req
        self.cache_block, self.count_tokens = cache_block, count_tokens
        self.created = time.time()
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # closed ones
        self._open: dict[str, Any] | None = None  # the item being written
        self._pieces: list[str] = []  # its text or arguments so far
        self._call_index = -1  # the reader's index of the call being written

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        return {"type": f"response.{kind}", "sequence_number": self.seq - 1, **fields}

    def start(self) -> list[dict[str, Any]]:
        response = response_object(self.response_id, self.created, self.model, self.req, [])
        return [self._event("created", response=response),
                self._event("in_progress", response=response)]

    def feed(self, reasoning: str, text: str, parts: list[CallDelta]) -> list[dict[str, Any]]:
        """The events for the reply's new reasoning, text and call parts."""
        events = self._grow("reasoning", reasoning) + self._grow("message", text)
        for part in parts:
            events += self._call(part)
        return events

    def reasoning_texts(self) -> list[str]:
        """The reply's reasoning so far, one text per reasoning item (the open one too)."""
        texts = [part["text"] for item in self.items if item["type"] == "reasoning"
                 for part in item["content"]]
        if self._open is not None and self._open["type"] == "reasoning":
            texts.append("".join(self._pieces))
        return texts

    def finish(self, out: RequestOutput, reasoning_tokens: int | None = None
               ) -> list[dict[str, Any]]:
        """The last events: the open item closed (incomplete if the reply was cut short), the
        response completed or incomplete. reasoning_tokens (for usage): counted here with
        count_tokens when not given."""
        reason = "max_output_tokens" if out.outputs[0].finish_reason == "length" else None
        if reasoning_tokens is None:
            reasoning_tokens = sum(map(self.count_tokens, self.reasoning_texts()))
        events = []
        if not self.items and self._open is None:  # an empty reply is an empty message
            events += self._open_item("message")
        events += self._close("incomplete" if reason else "completed")
        response = response_object(
            self.response_id, self.created, self.model, self.req, self.items,
            response_usage(out, self.cache_block, reasoning_tokens), reason, done=True)
        return events + [self._event("incomplete" if reason else "completed",
                                     response=response)]

    def _open_item(self, kind: str) -> list[dict[str, Any]]:
        self._open = _opened(kind, new_id("rs" if kind == "reasoning" else "msg"))
        where = {"item_id": self._open["id"], "output_index": len(self.items)}
        return [self._event("output_item.added", output_index=len(self.items),
                            item=dict(self._open)),
                self._event("content_part.added", content_index=0, part=_part(kind, ""),
                            **where)]

    def _grow(self, kind: str, delta: str) -> list[dict[str, Any]]:
        if not delta:
            return []
        events = []
        if self._open is None or self._open["type"] != kind:
            events += self._close() + self._open_item(kind)
        self._pieces.append(delta)
        where = {"item_id": self._open["id"], "output_index": len(self.items),
                 "content_index": 0}
        if kind == "reasoning":
            events.append(self._event("reasoning_text.delta", delta=delta, **where))
        else:
            events.append(self._event("output_text.delta", delta=delta, logprobs=[], **where))
        return events

    def _call(self, part: CallDelta) -> list[dict[str, Any]]:
        events = []
        if part.index != self._call_index:  # a new call: its item opens
            events += self._close()
            self._call_index = part.index
            self._open = {"type": "function_call", "id": new_id("fc"), "call_id": part.id,
                          "name": part.name, "arguments": "", "status": "in_progress"}
            events.append(self._event("output_item.added", output_index=len(self.items),
                                      item=dict(self._open)))
        if part.arguments:
            self._pieces.append(part.arguments)
            events.append(self._event("function_call_arguments.delta",
                                      item_id=self._open["id"], output_index=len(self.items),
                                      delta=part.arguments))
        return events

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        """The open item's done events; it joins the closed ones."""
        item, self._open = self._open, None
        if item is None:
            return []
        text, self._pieces = "".join(self._pieces), []
        where = {"item_id": item["id"], "output_index": len(self.items)}
        events = []
        if item["type"] == "function_call":
            item.update(arguments=text, status=status)
            events.append(self._event("function_call_arguments.done", arguments=text,
                                      name=item["name"], **where))
        else:
            kind = item["type"]
            part = _part(kind, text)
            if kind == "reasoning":
                events.append(self._event("reasoning_text.done", content_index=0, text=text,
                                          **where))
            else:
                events.append(self._event("output_text.done", content_index=0, text=text,
                                          logprobs=[], **where))
            events.append(self._event("content_part.done", content_index=0, part=part,
                                      **where))
            item.update(content=[part], status=status)
        events.append(self._event("output_item.done", output_index=len(self.items), item=item))
        self.items.append(item)
        return events


# What tokenizes a reply's reasoning for usage, off the event loop when it is long (a reply may
# reason for tens of thousands of tokens).
TokenCounter = Callable[[list[str]], Awaitable[int]]


async def response_events(events: ResponseEvents, stream: OutputStream,
                          reader: ReplyReader | None, count: TokenCounter
                          ) -> AsyncIterator[dict[str, Any]]:
    """A streamed response's events: the reply read by `reader` (None: as plain text) as it
    grows."""
    for event in events.start():
        yield event
    deltas = DeltaTracker(1, events.req.chat.stop)
    async for i, out in stream:
        text = deltas.text(i, out.outputs[0].text, out.finished)
        for event in events.feed(*_read(reader, text, out.finished)):
            yield event
        if out.finished:
            for event in events.finish(out, await count(events.reasoning_texts())):
                yield event


async def whole_response(events: ResponseEvents, out: RequestOutput,
                         reader: ReplyReader | None, count: TokenCounter) -> dict[str, Any]:
    """A reply read whole: the Response object its events would end with."""
    events.feed(*_read(reader, out.outputs[0].text, True))
    return events.finish(out, await count(events.reasoning_texts()))[-1]["response"]


def _read(reader: ReplyReader | None, text: str, finished: bool
          ) -> tuple[str, str, list[CallDelta]]:
    """(reasoning, text, call parts) of the reply's new text."""
    return ("", text, []) if reader is None else reader.feed(text, finished)
