"""A reasoning model's reply split into its reasoning and its answer, as vLLM's
`--reasoning-parser` splits it: the chat endpoint returns the first as `reasoning_content`
(DeepSeek's API name, which most clients read) and the second as `content`.

A ReasoningReader reads one choice's reply, streamed or whole (fed once): both give the same
split. Under a structured output (a forced tool call, a JSON schema) the reasoning is free and
the grammar constrains the answer after it (StructuredOutputsParams.starts_after). A prompt
that closes the reasoning itself (a template asked not to think) gets a reply that is all
answer.
"""

from __future__ import annotations

from specserve.server.tool_calls import hold_partial_tag


class ReasoningReader:
    """DeepSeek-R1's format (its distilled Llama and Qwen models, QwQ): the reasoning ends at
    `</think>`; the chat template opens `<think>` in the prompt, and a reply that writes it
    anyway has it left out. A reply without `</think>` was cut short while reasoning: all of
    it is reasoning (vLLM's `deepseek_r1` parser)."""

    START, END = "<think>", "</think>"

    def __init__(self, opened_in_prompt: bool = True) -> None:
        self._buf = ""
        self._started = False  # whether the reply's start is known not to be (part of) START
        self._answering = False
        # Whether a reply that does not open with START is all answer (Qwen3ReasoningReader).
        self._may_answer_at_once = not opened_in_prompt and self.MAY_SKIP

    MAY_SKIP = False  # whether a model may answer without reasoning when the prompt lets it

    @classmethod
    def reasons_first(cls, opened_in_prompt: bool) -> bool:
        """Whether the reply surely starts with reasoning (a structured output then starts
        after END); otherwise the answer may come at once and is constrained from the start."""
        return opened_in_prompt or not cls.MAY_SKIP

    def feed(self, text: str) -> tuple[str, str]:
        """The reply's new text -> (new reasoning, new content)."""
        if self._answering:
            return "", text
        self._buf += text
        if not self._started:
            head = self._buf.lstrip()
            if self.START.startswith(head):  # maybe the start of START: wait
                return "", ""
            self._started = True
            if head.startswith(self.START):
                self._buf = head[len(self.START):]
            elif self._may_answer_at_once:
                text, self._buf, self._answering = self._buf, "", True
                return "", text
        at = self._buf.find(self.END)
        if at >= 0:
            reasoning, content = self._buf[:at], self._buf[at + len(self.END):]
            self._buf, self._answering = "", True
            return reasoning, content
        reasoning, self._buf = hold_partial_tag(self._buf, self.END)  # maybe END's start
        return reasoning, ""

    def finish(self) -> tuple[str, str]:
        """What was held back, at the reply's end: reasoning (the reply stopped in it)."""
        rest, self._buf = self._buf, ""
        if not self._started and rest.strip() == self.START:
            rest = ""
        if not self._started and self._may_answer_at_once:
            return "", rest  # (whitespace, or the start of START, and no more)
        return rest, ""

    def read(self, text: str) -> tuple[str | None, str | None]:
        """A whole reply: (reasoning, content), None where empty."""
        reasoning, content = self.feed(text)
        more, rest = self.finish()
        return (reasoning + more) or None, (content + rest) or None


class Qwen3ReasoningReader(ReasoningReader):
    """Qwen3's format, vLLM's `qwen3` parser: the same tags, but a reply may answer without
    reasoning. Its hybrid models write `<think>` themselves (the template closes the reasoning
    in the prompt when asked not to think); the Instruct-2507 models never think; the
    Thinking-2507 template opens `<think>` in the prompt. So a reply that does not open with
    `<think>`, after a prompt that did not open it either, is all answer. As for deepseek_r1, a
    reply cut short before `</think>` stays reasoning, so that a streamed reply splits as the
    whole one does (vLLM's reads a whole one as all answer)."""

    MAY_SKIP = True


# --reasoning-parser's choices.
REASONING_PARSERS: dict[str, type[ReasoningReader]] = {"deepseek_r1": ReasoningReader,
                                                       "qwen3": Qwen3ReasoningReader}
