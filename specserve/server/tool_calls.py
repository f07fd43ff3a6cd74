"""Tool calls on the chat endpoint, as OpenAI's API and vLLM serve them.

- `tool_choice` "required" or a named function: the reply is constrained (a structured output)
  to a JSON array of calls, or to the named function's arguments, so any model gives calls
  that parse. These need no server flag.
- "auto" (the default when tools are given): the model decides, in its own format; the server
  reads its text with the parser it was started with (`--tool-call-parser`, as vLLM's).
- "none": the reply is text.

Each choice's reply goes through one CallReader, streamed or whole: streamed, text and calls
come out as the reply grows; whole, it is the same reader fed once, so both give the same
content and calls. Nothing here knows the HTTP models: serving.py turns CallDeltas into them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

_EMPTY_OBJECT = {"type": "object", "properties": {}}


def arguments_schema(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """What a named call's reply is constrained to: the function's parameters."""
    return parameters if parameters else _EMPTY_OBJECT


def calls_schema(tools: list[tuple[str, dict[str, Any] | None]],
                 parallel: bool = True) -> dict[str, Any]:
    """What tool_choice "required" constrains the reply to: a JSON array of one or more
    {"name", "parameters"} objects, each naming one of the tools with its parameters (one call
    only, without parallel calls). Definitions a parameters schema refers to ($defs, at its
    root) move to the root of this one, where its references then point."""
    defs: dict[str, Any] = {}
    variants = []
    for name, parameters in tools:
        parameters = dict(arguments_schema(parameters))
        for key in ("$defs", "definitions"):
            for def_name, definition in parameters.pop(key, {}).items():
                if defs.setdefault(key, {}).setdefault(def_name, definition) != definition:
                    raise ValueError(f"two tools define {key}/{def_name} differently")
        variants.append({"type": "object", "additionalProperties": False,
                         "properties": {"name": {"type": "string", "enum": [name]},
                                        "parameters": parameters},
                         "required": ["name", "parameters"]})
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": variants}}
    if not parallel:
        schema["maxItems"] = 1
    return {**schema, **defs}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class CallDelta:
    """Part of call `index`: its first part carries the id and name, later ones only more
    arguments (a parsed call comes whole, in one part)."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


class CallReader:
    """One choice's reply read as text and tool calls. feed() takes the reply's new text and
    returns (text for the content, call parts); finish() returns what was held back."""

    def __init__(self) -> None:
        self.num_calls = 0

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        raise NotImplementedError

    def finish(self) -> tuple[str, list[CallDelta]]:
        return "", []

    def _call(self, name: str, arguments: str) -> CallDelta:
        """A whole call, the next one."""
        self.num_calls += 1
        return CallDelta(self.num_calls - 1, arguments, new_call_id(), name)

    def read(self, text: str) -> tuple[str | None, list[CallDelta]]:
        """A whole reply: its content (None when it is empty) and its calls."""
        content, calls = self.feed(text)
        rest, more = self.finish()
        return (content + rest) or None, calls + more


class NamedCall(CallReader):
    """tool_choice names a function: the reply is its arguments, streamed as they come."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        if self.num_calls:
            return "", [CallDelta(0, text)] if text else []
        return "", [self._call(self.name, text)]

    def finish(self) -> tuple[str, list[CallDelta]]:
        return self.feed("") if not self.num_calls else ("", [])


class RequiredCalls(CallReader):
    """tool_choice "required": the reply is a JSON array of calls, sent when it is complete. A
    reply that does not parse (cut short by max_tokens) is returned as content."""

    def __init__(self) -> None:
        super().__init__()
        self._text: list[str] = []

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        self._text.append(text)
        return "", []

    def finish(self) -> tuple[str, list[CallDelta]]:
        text = "".join(self._text)
        try:
            calls = [(c["name"], c["parameters"]) for c in json.loads(text)]
        except (ValueError, TypeError, KeyError):
            return text, []
        return "", [self._call(name, json.dumps(parameters, ensure_ascii=False))
                    for name, parameters in calls]


class HermesCalls(CallReader):
    """tool_choice "auto" for models that write each call as
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen 2.5 and 3, and
    others; vLLM's `hermes` parser). Text outside the tags is content, streamed as it comes; a
    call is sent when its closing tag arrives. A call that does not parse stays in the content,
    tags and all. With calls, the whitespace that frames them (before the content, after it)
    is left out; without, the content is the text as written."""

    START, END = "<tool_call>", "</tool_call>"

    def __init__(self) -> None:
        super().__init__()
        self._buf = ""
        self._in_call = False
        self._space = ""  # whitespace held until more text follows it
        self._said = False  # whether any content went out

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        self._buf += text
        content, calls = [], []
        while True:
            if not self._in_call:
                at = self._buf.find(self.START)
                if at < 0:  # keep what may be the start of a tag
                    keep = partial_suffix(self._buf, self.START)
                    content.append(self._text(self._buf[:len(self._buf) - keep]))
                    self._buf = self._buf[len(self._buf) - keep:]
                    return "".join(content), calls
                content.append(self._text(self._buf[:at]))
                if not self._said:  # whitespace before the first call and any content
                    self._space = ""
                self._buf, self._in_call = self._buf[at + len(self.START):], True
            else:
                at = self._buf.find(self.END)
                if at < 0:
                    return "".join(content), calls
                body, self._buf = self._buf[:at], self._buf[at + len(self.END):]
                self._in_call = False
                call = _hermes_call(body)
                if call is None:
                    content.append(self._text(self.START + body + self.END))
                else:
                    calls.append(self._call(*call))

    def finish(self) -> tuple[str, list[CallDelta]]:
        rest = self.START + self._buf if self._in_call else self._buf  # an unclosed call
        self._buf, self._in_call = "", False
        text = self._text(rest)
        return (text if self.num_calls else text + self._space), []

    def _text(self, text: str) -> str:
        """Content out, its trailing whitespace held until more follows."""
        if self.num_calls and not self._said:
            text = text.lstrip()
        stripped = text.rstrip()
        if not stripped:
            self._space += text
            return ""
        out, self._space, self._said = self._space + stripped, text[len(stripped):], True
        return out


class Llama3JsonCalls(CallReader):
    """tool_choice "auto" for Llama 3.1-3.3's JSON tool calls: a reply that is calls and
    nothing else, `{"name": ..., "parameters": {...}}` (several separated by ";"), maybe after
    `<|python_tag|>` (vLLM's `llama3_json` parser). A reply that starts otherwise is text,
    streamed as it comes; one that starts like a call is held and read whole at its end, and
    stays text if it does not parse."""

    TAG = "<|python_tag|>"

    def __init__(self) -> None:
        super().__init__()
        self._head = ""  # the reply until it is known to be text or calls
        self._calls: bool | None = None  # undecided

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        if self._calls is False:
            return text, []
        self._head += text
        if self._calls is None:
            start = self._head.lstrip()
            if start.startswith(("{", self.TAG)):
                self._calls = True
            elif start and not self.TAG.startswith(start):
                self._calls = False
                text, self._head = self._head, ""
                return text, []
        return "", []

    def finish(self) -> tuple[str, list[CallDelta]]:
        text, self._head = self._head, ""
        calls = _llama3_calls(text) if self._calls else None
        if calls is None:
            return text, []
        return "", [self._call(name, arguments) for name, arguments in calls]


def _llama3_calls(text: str) -> list[tuple[str, str]] | None:
    """The calls in a reply of JSON objects separated by ";", or None if it is anything else."""
    text = text.strip().removeprefix(Llama3JsonCalls.TAG)
    decoder, calls, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and text[at] in " \t\r\n;":
            at += 1
        if at == len(text):
            return calls or None
        try:
            call, at = decoder.raw_decode(text, at)
            name = call["name"]
            arguments = call.get("parameters", call.get("arguments", {}))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        if not isinstance(name, str):
            return None
        calls.append((name, arguments if isinstance(arguments, str)
                      else json.dumps(arguments, ensure_ascii=False)))


def partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of text that begins tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _hermes_call(body: str) -> tuple[str, str] | None:
    try:
        call = json.loads(body)
        name, arguments = call["name"], call.get("arguments", {})
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if not isinstance(name, str):
        return None
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return name, arguments


# --tool-call-parser's choices: how "auto" reads a model's calls.
TOOL_CALL_PARSERS: dict[str, type[CallReader]] = {"hermes": HermesCalls,
                                                   "llama3_json": Llama3JsonCalls}


def call_reader(mode: str | None, parser: str | None, named: str | None = None
                ) -> CallReader | None:
    """The reader of one choice's reply, for a request's tool mode (None: text only)."""
    if mode == "named":
        return NamedCall(named)
    if mode == "required":
        return RequiredCalls()
    if mode == "auto":
        return TOOL_CALL_PARSERS[parser]()
    return None


def merge_calls(parts: list[CallDelta]) -> list[tuple[str, str, str]]:
    """A reply's calls as (id, name, arguments), its parts joined."""
    calls: dict[int, list] = {}
    for part in parts:
        if part.index not in calls:
            calls[part.index] = [part.id, part.name, part.arguments]
        else:
            calls[part.index][2] += part.arguments
    return [tuple(calls[i]) for i in sorted(calls)]
