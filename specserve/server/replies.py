"""How a chat reply is read: its reasoning split off (a reasoning parser), then its content
and tool calls (a call reader). The chat endpoint and the Responses API read alike."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from specserve.server.reasoning import ReasoningReader
from specserve.server.tool_calls import CallDelta, CallReader, call_reader


@dataclasses.dataclass(slots=True)
class ReplyReader:
    """One choice's reply read as reasoning, then content and tool calls."""

    reasoning: ReasoningReader | None
    calls: CallReader | None
    keep_reasoning: bool = True  # vLLM's include_reasoning: false drops it from the response
    tool_mode: str | None = None  # the request's (ChatCompletionRequest.tool_mode)

    def feed(self, text: str, finished: bool) -> tuple[str, str, list[CallDelta]]:
        """The reply's new text -> (reasoning, content, call parts); at its end, with what
        the readers held back."""
        reasoning, calls = "", []
        if self.reasoning is not None:
            reasoning, text = self.reasoning.feed(text)
            if finished:
                more, rest = self.reasoning.finish()
                reasoning, text = reasoning + more, text + rest
        if self.calls is not None:
            text, calls = self.calls.feed(text)
            if finished:
                rest, more = self.calls.finish()
                text, calls = text + rest, calls + more
        return (reasoning if self.keep_reasoning else ""), text, calls

    def finish_reason(self, finish_reason: str | None) -> str | None:
        """OpenAI's: "tool_calls" when the model chose to call (auto) or had to (required)
        and did; a named call ends as its reply ended ("stop")."""
        if (self.calls is not None and self.calls.num_calls and finish_reason == "stop"
                and self.tool_mode in ("auto", "required")):
            return "tool_calls"
        return finish_reason


def reply_reader(req, tool_call_parser: str | None,
                 reasoning: Callable[[], ReasoningReader] | None) -> ReplyReader | None:
    """How one choice of a chat request is read (None: as text). reasoning: makes the reply's
    reasoning reader; None for a reply without reasoning to split off."""
    named = req.tool_choice.function.name if req.tool_mode == "named" else None
    calls = call_reader(req.tool_mode, tool_call_parser, named, req.parallel_tool_calls)
    reasoning = reasoning() if reasoning is not None else None
    if calls is None and reasoning is None:
        return None
    return ReplyReader(reasoning, calls, req.include_reasoning, req.tool_mode)
