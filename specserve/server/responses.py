"""OpenAI's Responses API (`POST /v1/responses`), as vLLM serves it, over the chat endpoint's
machinery: a request is read into the chat request it means (input items as messages,
`instructions` as a system message, function tools, `text.format` as a structured output) and
runs as one; its reply comes back as output items (reasoning, a message, function calls),
whole or as the API's typed stream events.

Stateless: nothing is stored, so `previous_response_id` and `background` are refused; a client
sends the whole conversation as `input` (the function calls and their outputs included), as
with `store: false`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from specserve.outputs import RequestOutput
from specserve.server.async_engine import OutputStream
from specserve.server.protocol import (
    ChatCompletionRequest,
    OpenAIModel,
    PositiveInt,
    SpecTokens,
    SpeculationOptions,
    one_of,
    refuse_unsupported,
)
from specserve.server.streaming import DeltaTracker
from specserve.server.tool_calls import CallDelta


# ---- the request -------------------------------------------------------------------------------
class TextPart(OpenAIModel):
    type: Literal["input_text", "output_text", "text"]
    text: StrictStr


class MessageItem(OpenAIModel):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Annotated[StrictStr | list[TextPart],
                       one_of("a string or a list of input_text parts")]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "\n".join(
            p.text for p in self.content)


class FunctionCallItem(OpenAIModel):
    """A call the model made earlier, sent back with the conversation."""

    type: Literal["function_call"]
    call_id: StrictStr
    name: StrictStr
    arguments: StrictStr
    id: StrictStr | None = None


class FunctionCallOutputItem(OpenAIModel):
    type: Literal["function_call_output"]
    call_id: StrictStr
    output: Annotated[StrictStr | list[TextPart], one_of("a string or a list of text parts")]


class ReasoningItem(OpenAIModel):
    """Earlier reasoning, sent back: not rendered (chat templates drop it too)."""

    type: Literal["reasoning"]


InputItem = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem,
                      one_of("a message, function_call, function_call_output or reasoning "
                             "item")]


class FunctionTool(OpenAIModel):
    type: Literal["function"]
    name: Annotated[StrictStr, Field(min_length=1, max_length=256)]
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class NamedFunction(OpenAIModel):
    type: Literal["function"]
    name: StrictStr


class TextFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    name: StrictStr | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class TextConfig(OpenAIModel):
    format: TextFormat | None = None


# Known fields that would change the result and that a stateless server cannot honour.
_UNSUPPORTED = {"previous_response_id": (None,), "conversation": (None,),
                "background": (None, False), "prompt": (None,), "top_logprobs": (None, 0),
                "truncation": (None, "disabled"), "max_tool_calls": (None,)}


class ResponsesRequest(OpenAIModel):
    model: StrictStr | None = None
    input: Annotated[StrictStr | Annotated[list[InputItem], Field(min_length=1)],
                     one_of("a string or a non-empty list of input items")]
    instructions: StrictStr | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Annotated[StrictFloat, Field(ge=0, le=2)] | None = None
    top_p: Annotated[StrictFloat, Field(gt=0, le=1)] | None = None
    stream: StrictBool = False
    tools: list[FunctionTool] | None = None
    tool_choice: Annotated[Literal["none", "auto", "required"] | NamedFunction | None,
                           one_of('"none", "auto", "required" or {"type": "function", '
                                  '"name": ...}')] = None
    parallel_tool_calls: StrictBool = True
    text: TextConfig | None = None
    metadata: dict[str, StrictStr] | None = None
    user: StrictStr | None = None
    # Accepted, with nothing to do: a stateless server stores nothing and has no reasoning
    # effort to set or encrypted reasoning to include.
    store: StrictBool | None = None
    reasoning: dict[str, Any] | None = None
    include: list[StrictStr] | None = None
    # Extensions, as on the chat endpoint.
    seed: StrictInt | None = None
    top_k: StrictInt | None = None
    min_p: StrictFloat | None = None
    repetition_penalty: StrictFloat | None = None
    speculation: SpecTokens | SpeculationOptions | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    _chat: ChatCompletionRequest = PrivateAttr()

    @model_validator(mode="before")
    @classmethod
    def _refuse_stateful(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("include"), list) and \
                "message.output_text.logprobs" in data["include"]:
            raise ValueError("include message.output_text.logprobs is not supported")
        return refuse_unsupported(data, _UNSUPPORTED)

    @model_validator(mode="after")
    def _as_chat(self) -> ResponsesRequest:
        """The chat request this one means, validated as the chat endpoint validates it."""
        body: dict[str, Any] = {"messages": self._messages(), "stream": self.stream}
        if self.max_output_tokens is not None:
            body["max_completion_tokens"] = self.max_output_tokens
        if self.tools:
            body["tools"] = [{"type": "function", "function": t.model_dump(
                exclude={"type"}, exclude_none=True)} for t in self.tools]
        if isinstance(self.tool_choice, NamedFunction):
            body["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        elif self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        fmt = self.text.format if self.text is not None else None
        if fmt is not None and fmt.type != "text":
            body["response_format"] = (
                {"type": "json_object"} if fmt.type == "json_object" else
                {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_,
                                                        "strict": fmt.strict}})
        for name in ("temperature", "top_p", "parallel_tool_calls", "user", "seed", "top_k",
                     "min_p", "repetition_penalty", "speculation", "chat_template_kwargs"):
            if (value := getattr(self, name)) is not None:
                body[name] = value.model_dump() if hasattr(value, "model_dump") else value
        try:
            self._chat = ChatCompletionRequest.model_validate(body)
        except ValidationError as exc:  # one sentence, as the endpoint's own errors read
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{where + ': ' if where else ''}"
                             f"{first['msg'].removeprefix('Value error, ')}") from None
        return self

    def _messages(self) -> list[dict[str, Any]]:
        """The input as chat messages: an assistant's text and the function calls after it one
        assistant turn (as the chat endpoint receives it), each output a tool message."""
        messages: list[dict[str, Any]] = []
        if self.instructions is not None:
            messages.append({"role": "system", "content": self.instructions})
        items = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) \
            else self.input
        for item in items:
            if isinstance(item, MessageItem):
                messages.append({"role": item.role, "content": item.text()})
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": None,
                                     "tool_calls": [call]})
            elif isinstance(item, FunctionCallOutputItem):
                output = item.output if isinstance(item.output, str) else "\n".join(
                    p.text for p in item.output)
                messages.append({"role": "tool", "tool_call_id": item.call_id,
                                 "content": output})
        if not messages:
            raise ValueError("input has no message to answer")
        return messages

    @property
    def chat(self) -> ChatCompletionRequest:
        return self._chat


# ---- the response ------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_object(response_id: str, created: float, model: str, req: ResponsesRequest,
                    status: str, output: list[dict], usage: dict | None = None,
                    incomplete: str | None = None) -> dict[str, Any]:
    """The Response object, with the request's settings echoed as OpenAI echoes them."""
    tool_choice = (req.tool_choice.model_dump() if isinstance(req.tool_choice, NamedFunction)
                   else req.tool_choice or "auto")
    return {
        "id": response_id, "object": "response", "created_at": created, "model": model,
        "status": status, "output": output, "usage": usage, "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {}, "parallel_tool_calls": req.parallel_tool_calls,
        "temperature": req.temperature, "top_p": req.top_p, "tool_choice": tool_choice,
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()],
        "text": {"format": (req.text.format.model_dump(by_alias=True, exclude_none=True)
                            if req.text and req.text.format else {"type": "text"})},
        "store": False, "previous_response_id": None, "reasoning": None, "user": req.user,
        "completed_at": time.time() if status in ("completed", "incomplete") else None,
    }


def usage(out: RequestOutput, cache_block: int | None, reasoning_tokens: int) -> dict[str, Any]:
    """The Responses API's usage. cache_block: the prefix cache's block size (None: no
    prefix cache): the prompt's full blocks read from it are cached tokens, the rest of them
    written to it."""
    prompt, completion = len(out.prompt_token_ids), len(out.outputs[0].token_ids)
    cached = out.metrics.num_cached_tokens if out.metrics is not None else 0
    written = 0 if cache_block is None else max(0, prompt // cache_block * cache_block - cached)
    return {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, completion)},
            "total_tokens": prompt + completion}


def response_status(finish_reason: str | None) -> tuple[str, str | None]:
    """(the response's status, why it is incomplete)."""
    return ("incomplete", "max_output_tokens") if finish_reason == "length" else (
        "completed", None)


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}


def message_item(item_id: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {"type": "message", "id": item_id, "role": "assistant", "status": status,
            "content": content}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call_id: str, name: str, arguments: str,
              status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


# ---- the stream ----------------------------------------------------------------------------------
class ResponseEvents:
    """The API's typed events for one reply: the response created, then each output item
    opened (`output_item.added`, its content part), grown (`*.delta`), closed (`*.done`) in
    the order the reply writes them (reasoning, message, function calls), then the response
    completed (or incomplete)."""

    def __init__(self, response_id: str, model: str, req: ResponsesRequest,
                 cache_block: int | None, count_tokens: Callable[[str], int]):
        """count_tokens: a text's tokens (for the reasoning's, in usage)."""
        self.response_id, self.model, self.req = response_id, model, req
        self.cache_block, self.count_tokens = cache_block, count_tokens
        self.created = time.time()
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # closed ones
        self._open: dict[str, Any] | None = None  # the item being written
        self._text: list[str] = []  # its text or arguments so far
        self._call_index = -1  # the reader's index of the call being written

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        return {"type": f"response.{kind}", "sequence_number": self.seq - 1, **fields}

    def start(self) -> list[dict[str, Any]]:
        response = response_object(self.response_id, self.created, self.model, self.req,
                                   "in_progress", [])
        return [self._event("created", response=response),
                self._event("in_progress", response=response)]

    def reasoning(self, delta: str) -> list[dict[str, Any]]:
        return self._grow("reasoning", delta)

    def text(self, delta: str) -> list[dict[str, Any]]:
        return self._grow("message", delta)

    def call(self, part: CallDelta) -> list[dict[str, Any]]:
        events = []
        if part.index != self._call_index:  # a new call: its item opens
            events += self._close()
            self._call_index = part.index
            self._open = call_item(new_id("fc"), part.id, part.name, "", "in_progress")
            events.append(self._event("output_item.added", output_index=len(self.items),
                                      item=dict(self._open)))
        if part.arguments:
            self._text.append(part.arguments)
            events.append(self._event("function_call_arguments.delta",
                                      item_id=self._open["id"], output_index=len(self.items),
                                      delta=part.arguments))
        return events

    def finish(self, out: RequestOutput) -> list[dict[str, Any]]:
        """The last events: the open item closed (incomplete if the reply was cut short), the
        response completed or incomplete."""
        status, incomplete = response_status(out.outputs[0].finish_reason)
        if not self.items and self._open is None:  # an empty reply is an empty message
            self._open = message_item(new_id("msg"), None, "in_progress")
            events = [self._event("output_item.added", output_index=0, item=dict(self._open)),
                      self._event("content_part.added", item_id=self._open["id"],
                                  output_index=0, content_index=0, part=_text_part(""))]
        else:
            events = []
        events += self._close(status)
        reasoning = sum(self.count_tokens(part["text"]) for item in self.items
                        if item["type"] == "reasoning" for part in item["content"])
        response = response_object(self.response_id, self.created, self.model, self.req,
                                   status, self.items, usage(out, self.cache_block, reasoning),
                                   incomplete)
        return events + [self._event("completed" if status == "completed" else "incomplete",
                                     response=response)]

    def feed(self, reasoning: str, text: str, parts: list[CallDelta]) -> list[dict[str, Any]]:
        """The events for the reply's new reasoning, text and call parts."""
        events = self.reasoning(reasoning) + self.text(text)
        for part in parts:
            events += self.call(part)
        return events

    def _grow(self, kind: str, delta: str) -> list[dict[str, Any]]:
        if not delta:
            return []
        events = []
        if self._open is None or self._open["type"] != kind:
            events += self._close()
            item_id = new_id("rs" if kind == "reasoning" else "msg")
            self._open = (reasoning_item(item_id, "", "in_progress") if kind == "reasoning"
                          else message_item(item_id, None, "in_progress"))
            if kind == "reasoning":  # its content part is listed as the item opens
                self._open["content"] = []
            events.append(self._event("output_item.added", output_index=len(self.items),
                                      item=dict(self._open)))
            part = ({"type": "reasoning_text", "text": ""} if kind == "reasoning"
                    else _text_part(""))
            events.append(self._event("content_part.added", item_id=item_id,
                                      output_index=len(self.items), content_index=0,
                                      part=part))
        self._text.append(delta)
        where = {"item_id": self._open["id"], "output_index": len(self.items),
                 "content_index": 0}
        if kind == "reasoning":
            events.append(self._event("reasoning_text.delta", delta=delta, **where))
        else:
            events.append(self._event("output_text.delta", delta=delta, logprobs=[], **where))
        return events

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        """The open item's done events; it joins the closed ones."""
        item, self._open = self._open, None
        if item is None:
            return []
        text, self._text = "".join(self._text), []
        where = {"item_id": item["id"], "output_index": len(self.items)}
        events = []
        if item["type"] == "function_call":
            item.update(arguments=text, status=status)
            events.append(self._event("function_call_arguments.done", arguments=text,
                                      name=item["name"], **where))
        else:
            if item["type"] == "reasoning":
                part = {"type": "reasoning_text", "text": text}
                events.append(self._event("reasoning_text.done", content_index=0, text=text,
                                          **where))
            else:
                part = _text_part(text)
                events.append(self._event("output_text.done", content_index=0, text=text,
                                          logprobs=[], **where))
            events.append(self._event("content_part.done", content_index=0, part=part,
                                      **where))
            item.update(content=[part], status=status)
        events.append(self._event("output_item.done", output_index=len(self.items), item=item))
        self.items.append(item)
        return events


async def response_events(events: ResponseEvents, stream: OutputStream, reader,
                          ) -> AsyncIterator[dict[str, Any]]:
    """A streamed response's events: the reply read by `reader` (serving's reply reader, or
    None for plain text) as it grows."""
    for event in events.start():
        yield event
    deltas = DeltaTracker(1, events.req.chat.stop)
    async for i, out in stream:
        text = deltas.text(i, out.outputs[0].text, out.finished)
        for event in events.feed(*_read(events, reader, text, out.finished)):
            yield event
        if out.finished:
            for event in events.finish(out):
                yield event


def whole_response(events: ResponseEvents, out: RequestOutput, reader) -> dict[str, Any]:
    """A reply read whole: the Response object the same events would end with."""
    events.start()
    events.feed(*_read(events, reader, out.outputs[0].text, True))
    return events.finish(out)[-1]["response"]


def _read(events: ResponseEvents, reader, text: str, finished: bool
          ) -> tuple[str, str, list[CallDelta]]:
    """(reasoning, text, call parts) of the reply's new text."""
    if reader is None:
        return "", text, []
    reasoning, text, parts = reader.feed(text, finished)
    return (reasoning if events.req.chat.include_reasoning else ""), text, parts
