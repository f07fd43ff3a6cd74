"""Tool calls on the chat endpoint, as OpenAI's API and vLLM serve them.

- `tool_choice` "required" or a named function: the reply is constrained (a structured output)
  to a JSON array of calls, or to the named function's arguments, so any model gives calls
  that parse. These need no server flag.
- "auto" (the default when tools are given): the model decides, in its own format; the server
  reads its text with the parser it was started with (`--tool-call-parser`, as vLLM's).
- "none": the reply is text.

Each choice's reply goes through one CallReader, streamed or whole: streamed, text and calls
come out as the reply grows; whole, it is the same reader fed once, so both give the same
content and calls. Nothing here knows the HTTP models: serving.py and responses.py turn
CallDeltas into them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from specserve.server.errors import is_utf8


def arguments_schema(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """What a named call's reply is constrained to: the function's parameters."""
    return parameters if parameters else {"type": "object", "properties": {}}


def calls_schema(tools: list[tuple[str, dict[str, Any] | None]],
                 parallel: bool = True) -> dict[str, Any]:
    """What tool_choice "required" constrains the reply to: a JSON array of one or more
    {"name", "parameters"} objects, each naming one of the tools with its parameters (one call
    only, without parallel calls). The definitions a parameters schema keeps at its root
    ($defs, definitions) move to the root of this one, where references to them point; its
    other local references ("#", "#/properties/...") are re-pointed to where it now lies."""
    defs: dict[str, dict[str, Any]] = {}
    variants = []
    for i, (name, parameters) in enumerate(tools):
        parameters = dict(arguments_schema(parameters))
        here = f"#/items/anyOf/{i}/properties/parameters"
        try:
            for key in ("$defs", "definitions"):
                own = parameters.pop(key, {})
                if not isinstance(own, dict):
                    raise ValueError(f"{name}'s parameters: {key} must be an object")
                for def_name, definition in own.items():
                    definition = _nest_refs(definition, here)
                    if defs.setdefault(key, {}).setdefault(def_name, definition) != definition:
                        raise ValueError(f"two tools define {key}/{def_name} differently")
            parameters = _nest_refs(parameters, here)
        except RecursionError:
            raise ValueError(f"{name}'s parameters are nested too deeply") from None
        variants.append({"type": "object", "additionalProperties": False,
                         "properties": {"name": {"type": "string", "enum": [name]},
                                        "parameters": parameters},
                         "required": ["name", "parameters"]})
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": variants}}
    if not parallel:
        schema["maxItems"] = 1
    return {**schema, **defs}


def _nest_refs(schema: Any, here: str) -> Any:
    """schema, with its local references to anything but a root definition prefixed by
    `here`, the JSON pointer of where the schema now lies."""
    if isinstance(schema, list):
        return [_nest_refs(v, here) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if (key == "$ref" and isinstance(value, str) and (value == "#" or value.startswith("#/"))
                and not value.startswith(("#/$defs/", "#/definitions/"))):
            out[key] = here + value[1:]
        else:
            out[key] = _nest_refs(value, here)
    return out


def new_id(prefix: str) -> str:
    """An OpenAI-style object id: call_..., resp_..., msg_..., fc_..., rs_..."""
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def strict_loads(text: str) -> Any:
    """JSON text, strictly: ValueError for anything that is not JSON (NaN and Infinity
    included) or that nests too deeply to read."""
    try:
        return json.loads(text, parse_constant=_not_json)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def dumps_as_written(value: Any) -> str:
    """JSON text of a value read from the model, its characters as written; a lone surrogate
    (an escape the model wrote, which UTF-8 cannot carry) stays escaped."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value)
    return text


def _as_call(call: Any, *keys: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a call object the model wrote, its arguments under
    the first of `keys` it has; None if it is not one. The arguments must be an object, or the
    JSON text of one (some models write them so): a client reads them with json.loads and
    sends them back as an object, so "Paris" or null passed through broke both."""
    if not isinstance(call, dict) or not is_utf8(name := call.get("name")):
        return None
    arguments = next((call[k] for k in keys if k in call), {})
    if isinstance(arguments, str):
        try:
            is_object = is_utf8(arguments) and isinstance(strict_loads(arguments), dict)
        except ValueError:
            is_object = False
        return (name, arguments) if is_object else None
    return (name, dumps_as_written(arguments)) if isinstance(arguments, dict) else None


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

    def __init__(self, max_calls: int | None = None) -> None:
        self.num_calls = 0
        # parallel_tool_calls false: 1; later calls are dropped (vLLM keeps the first too)
        self.max_calls = max_calls

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        raise NotImplementedError

    def finish(self) -> tuple[str, list[CallDelta]]:
        return "", []

    def _calls(self, calls: list[tuple[str, str]]) -> list[CallDelta]:
        """Whole calls, the next ones, as many as max_calls still allows."""
        if self.max_calls is not None:
            calls = calls[:max(0, self.max_calls - self.num_calls)]
        parts = [CallDelta(self.num_calls + i, arguments, new_id("call"), name)
                 for i, (name, arguments) in enumerate(calls)]
        self.num_calls += len(parts)
        return parts

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
        # The call opens with its first text: while the reply still reasons, a header sent
        # on an empty piece opened the Responses API's function_call item before the
        # reasoning item that follows, and its arguments went into that one.
        return "", self._calls([(self.name, text)]) if text else []

    def finish(self) -> tuple[str, list[CallDelta]]:
        # No text, no call: the grammar's reply is never empty, so a reply cut short while
        # it still reasoned made none (a call with no arguments would be run by an agent).
        return "", []


class RequiredCalls(CallReader):
    """tool_choice "required": the reply is a JSON array of `{"name", "parameters"}` calls (its
    grammar says so), read as it grows. A call goes out with the first of its parameters' text
    (the model's own JSON text, as a named call's arguments are), then the rest as it comes. A
    reply cut short by max_tokens keeps the calls it began; one cut before any name is
    content."""

    def __init__(self, max_calls: int | None = None) -> None:
        super().__init__(max_calls)
        self._text: list[str] = []  # the whole reply, for one cut before any call
        self._depth = 0  # of brackets and braces: a call's members are at depth 2
        self._in_string = self._escape = False
        self._string: list[str] | None = None  # a depth-2 string being read (a key, a name)
        self._key: str | None = None  # the member whose value comes next
        self._value: str | None = None  # the parameters value being read: its first char
        self._expect_value = False  # after "parameters":
        self._name: str | None = None  # the open call's
        self._held: list[str] = []  # its parameters text read before its name
        self._sent = False  # whether it went out (or was dropped past max_calls)
        self._dropped = False

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        self._text.append(text)
        parts: list[CallDelta] = []
        value: list[str] = []  # parameters text read in this piece
        for c in text:
            if self._value is not None and self._value not in '{["' and not self._in_string \
                    and (c in ",}" or c.isspace()):
                self._value = None  # a number or literal ended before this character
                parts += self._send("".join(value))
                value = []
            if self._value is not None:
                value.append(c)
                self._scan(c)
                if self._depth == 2 and not self._in_string and (
                        c in "}]" or (c == '"' and self._value == '"')):
                    self._value = None  # an object, array or string value closed
                    parts += self._send("".join(value))
                    value = []
                continue
            if self._expect_value and not c.isspace():
                self._expect_value, self._value = False, c
                value.append(c)
                self._scan(c)
                continue
            was_in_string = self._in_string
            self._scan(c)
            if self._depth == 2 and not was_in_string and self._in_string:
                self._string = []
            elif was_in_string and self._string is not None:
                if self._in_string:
                    self._string.append(c)
                else:
                    named = self._end_string("".join(self._string))
                    self._string = None
                    if named and self._held:  # its parameters came first: it goes out now
                        parts += self._send("")
            elif c == ":" and self._depth == 2 and self._key == "parameters":
                self._expect_value, self._key = True, None
            elif c == "{" and self._depth == 2:  # a call begins
                if self._name is not None and not self._sent:  # the last one had no parameters
                    parts += self._send("")
                self._key = self._name = None
                self._held, self._sent, self._dropped = [], False, False
        if value:
            parts += self._send("".join(value))
        return "", parts

    def _scan(self, c: str) -> None:
        """Strings and nesting, one character at a time."""
        if self._in_string:
            if self._escape:
                self._escape = False
            elif c == "\\":
                self._escape = True
            elif c == '"':
                self._in_string = False
        elif c == '"':
            self._in_string = True
        elif c in "{[":
            self._depth += 1
        elif c in "}]":
            self._depth -= 1

    def _end_string(self, raw: str) -> bool:
        """A depth-2 string ended: a member's key, or its value. True for the call's name."""
        if self._key is None:
            self._key = raw
            return False
        named = self._key == "name"
        if named:
            try:
                self._name = strict_loads(f'"{raw}"')
            except ValueError:
                self._name = raw
        self._key = None
        return named

    def _send(self, text: str) -> list[CallDelta]:
        """Parameters text of the open call: out once its name is known, held until then."""
        if self._name is None:
            self._held.append(text)
            return []
        if self._dropped:
            return []
        if not self._sent:
            self._sent = True
            text, self._held = "".join(self._held) + text, []
            parts = self._calls([(self._name, text)]) if is_utf8(self._name) else []
            self._dropped = not parts
            return parts
        return [CallDelta(self.num_calls - 1, text)] if text else []

    def finish(self) -> tuple[str, list[CallDelta]]:
        parts = self._send("") if self._name is not None and not self._sent else []
        if not self.num_calls:
            return "".join(self._text), []
        return "", parts


class HermesCalls(CallReader):
    """tool_choice "auto" for models that write each call as
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen 2.5 and 3, and
    others; vLLM's `hermes` parser). Text outside the tags is content, streamed as it comes; a
    call is sent when its closing tag arrives. A call that does not parse stays in the content,
    tags and all. With calls, the whitespace that frames them (before the content, after it)
    is left out; without, the content is the text as written."""

    START, END = "<tool_call>", "</tool_call>"

    def __init__(self, max_calls: int | None = None) -> None:
        super().__init__(max_calls)
        self._buf = ""  # outside a call: what may be the start of a tag
        self._body: list[str] | None = None  # inside a call: its text so far, in pieces
        self._tail = ""  # the body's last characters, where a closing tag may have begun
        self._space = ""  # whitespace held until more text follows it
        self._space_before = ""  # the whitespace held when the open call began
        self._said = False  # whether any content went out

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        content, calls = [], []
        while True:
            if self._body is None:
                text, self._buf = self._buf + text, ""
                at = text.find(self.START)
                if at < 0:  # keep what may be the start of a tag
                    text, self._buf = hold_partial_tag(text, self.START)
                    content.append(self._text(text))
                    return "".join(content), calls
                content.append(self._text(text[:at]))
                self._space_before = self._space
                if not self._said:  # whitespace before the first call and any content
                    self._space = ""
                self._body, self._tail, text = [], "", text[at + len(self.START):]
            else:
                # Search only the new text and the few characters before it: a long call
                # is scanned once, not once per step.
                window = self._tail + text
                at = window.find(self.END)
                if at < 0:
                    self._body.append(text)
                    self._tail = window[-(len(self.END) - 1):]
                    return "".join(content), calls
                body = "".join(self._body) + text
                end = len(body) - len(window) + at
                body, text = body[:end], body[end + len(self.END):]
                self._body = None
                call = _hermes_call(body)
                if call is None:  # not a call: content, with the whitespace before it
                    if not self._said:
                        self._space = self._space_before
                    content.append(self._text(self.START + body + self.END))
                else:
                    calls += self._calls([call])

    def finish(self) -> tuple[str, list[CallDelta]]:
        if self._body is not None:  # an unclosed call: content
            if not self._said:
                self._space = self._space_before
            rest = self.START + "".join(self._body)
        else:
            rest = self._buf
        self._buf, self._body = "", None
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

    def __init__(self, max_calls: int | None = None) -> None:
        super().__init__(max_calls)
        self._head = ""  # the reply until it is known to be text or calls
        self._held: list[str] = []  # a reply that is calls, in pieces
        self._is_calls: bool | None = None  # undecided

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        if self._is_calls is False:
            return text, []
        if self._is_calls:
            self._held.append(text)
            return "", []
        self._head += text
        start = self._head.lstrip()
        if start.startswith(("{", self.TAG)):
            self._is_calls, self._held, self._head = True, [self._head], ""
        elif start and not self.TAG.startswith(start):
            self._is_calls = False
            text, self._head = self._head, ""
            return text, []
        return "", []

    def finish(self) -> tuple[str, list[CallDelta]]:
        text = self._head + "".join(self._held)
        self._head, self._held = "", []
        calls = _llama3_calls(text) if self._is_calls else None
        if calls is None:
            return text, []
        return "", self._calls(calls)


def _llama3_calls(text: str) -> list[tuple[str, str]] | None:
    """The calls in a reply of JSON objects separated by ";", or None if it is anything else."""
    text = text.strip().removeprefix(Llama3JsonCalls.TAG)
    decoder, calls, at = json.JSONDecoder(parse_constant=_not_json), [], 0
    while True:
        while at < len(text) and text[at] in " \t\r\n;":
            at += 1
        if at == len(text):
            return calls or None
        try:
            call, at = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):
            return None
        if (call := _as_call(call, "parameters", "arguments")) is None:
            return None
        calls.append(call)


def hold_partial_tag(text: str, tag: str) -> tuple[str, str]:
    """(text, held): held is the longest end of text that begins tag, kept for the next
    piece of a streamed reply (the tag may be split across them)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return text[:-n], text[-n:]
    return text, ""


def _hermes_call(body: str) -> tuple[str, str] | None:
    try:
        return _as_call(strict_loads(body), "arguments")
    except ValueError:
        return None


# --tool-call-parser's choices: how "auto" reads a model's calls.
TOOL_CALL_PARSERS: dict[str, type[CallReader]] = {"hermes": HermesCalls,
                                                   "llama3_json": Llama3JsonCalls}


def call_reader(mode: str | None, parser: str | None, named: str | None = None,
                parallel: bool = True) -> CallReader | None:
    """The reader of one choice's reply, for a request's tool mode (None: text only)."""
    if mode == "named":
        return NamedCall(named)
    if mode == "required":
        return RequiredCalls(None if parallel else 1)
    if mode == "auto":
        return TOOL_CALL_PARSERS[parser](None if parallel else 1)
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
