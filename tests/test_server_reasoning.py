"""--reasoning-parser deepseek_r1: a reply split into reasoning_content and content, streamed in
any pieces as read whole, chained with a tool-call parser, and on a live server against the
offline engine's text (greedy, fp32)."""

from __future__ import annotations

import json
import random

import openai
import pytest
from test_server import MODEL, MODEL_FLAGS, LiveServer, one_thread

from specserve import SamplingParams, StructuredOutputsParams
from specserve.server.reasoning import ReasoningReader
from specserve.server.replies import ReplyReader
from specserve.server.tool_calls import HermesCalls, merge_calls

REPLIES = {
    "<think>\nAdd them.\n</think>\n\n4": ("\nAdd them.\n", "\n\n4"),
    "Add them.</think>4": ("Add them.", "4"),  # the template opened <think>
    "cut short while reasoning": ("cut short while reasoning", None),
    "  <think>x</think>y": ("x", "y"),
    "</think>only an answer": (None, "only an answer"),
    "<think>": (None, None),
    "<thin": ("<thin", None),
    "ends in a partial tag </thi": ("ends in a partial tag </thi", None),
    "a</think>b</think>c": ("a", "b</think>c"),  # the first closes the reasoning
}


def _streamed(text: str, cuts: list[int],
              reader: ReasoningReader | None = None) -> tuple[str | None, str | None]:
    reader, reasoning, content = reader or ReasoningReader(), [], []
    for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
        r, c = reader.feed(text[a:b])
        reasoning.append(r)
        content.append(c)
    r, c = reader.finish()
    return "".join(reasoning) + r or None, "".join(content) + c or None


# Qwen3 (vLLM's qwen3 parser) after a prompt that did not open <think>: a reply that does not
# open it either answered at once (Qwen3-Instruct-2507 never thinks).
QWEN3_REPLIES = {
    "<think>\nAdd them.\n</think>\n\n4": ("\nAdd them.\n", "\n\n4"),
    "  <think>x</think>y": ("x", "y"),
    "<think>cut short": ("cut short", None),
    "The answer is 4.": (None, "The answer is 4."),
    "4</think>": (None, "4</think>"),  # no reasoning was opened
    "<thin": (None, "<thin"),
    "  ": (None, "  "),
}


@pytest.mark.parametrize("text", QWEN3_REPLIES)
def test_a_qwen3_reply_may_answer_at_once(text: str):
    from specserve.server.reasoning import REASONING_PARSERS

    qwen3 = REASONING_PARSERS["qwen3"]
    assert qwen3(opened_in_prompt=False).read(text) == QWEN3_REPLIES[text]
    assert _streamed(text, list(range(1, len(text))), qwen3(opened_in_prompt=False)) == \
        QWEN3_REPLIES[text]
    assert not qwen3.reasons_first(False) and qwen3.reasons_first(True)
    # After a prompt that opened <think> (the Thinking-2507 template), deepseek_r1's reading.
    if text in REPLIES:
        assert qwen3(opened_in_prompt=True).read(text) == REPLIES[text]
    assert qwen3(opened_in_prompt=True).read("Add them.</think>4") == ("Add them.", "4")


@pytest.mark.parametrize("text", REPLIES)
def test_a_reply_streamed_in_any_pieces_splits_as_the_whole(text: str):
    assert ReasoningReader().read(text) == REPLIES[text]
    rng = random.Random(1)
    for cuts in [list(range(1, len(text))),
                 *(sorted(rng.sample(range(1, len(text)), min(k, len(text) - 1)))
                   for k in (1, 2, 5))]:
        assert _streamed(text, cuts) == REPLIES[text], cuts


def test_reasoning_then_tool_calls():
    text = ('I should look it up.</think>Sure. <tool_call>{"name": "get_weather", '
            '"arguments": {"city": "Oslo"}}</tool_call>')
    for cuts in (list(range(1, len(text))), [20, 40]):
        reader = ReplyReader(ReasoningReader(), HermesCalls())
        reasoning, content, parts = [], [], []
        bounds = list(zip([0, *cuts], [*cuts, len(text)], strict=True))
        for n, (a, b) in enumerate(bounds):
            r, c, p = reader.feed(text[a:b], finished=n == len(bounds) - 1)
            reasoning.append(r)
            content.append(c)
            parts += p
        assert "".join(reasoning) == "I should look it up."
        assert "".join(content) == "Sure."
        assert [(n, a) for _, n, a in merge_calls(parts)] == [("get_weather",
                                                               '{"city": "Oslo"}')]


# ---- a live server ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client() -> openai.OpenAI:
    live = LiveServer(*MODEL_FLAGS, "--reasoning-parser", "deepseek_r1")
    yield live.client()
    live.stop()


# SmolLM2 does not reason; continuing this assistant message, it writes a reply that closes the
# reasoning partway (" c.</think>Done.\nThink: a b"), as a reasoning model's does.
PATTERN = [{"role": "user", "content": "Think, then answer."},
           {"role": "assistant", "content": "Think: a b c.</think>Done.\nThink: a b c.</think>"
                                            "Done.\nThink: a b"}]
CONTINUE = {"add_generation_prompt": False, "continue_final_message": True}


def _offline(llm, messages, **kw) -> str:
    with one_thread():
        chat_kw = CONTINUE if messages[-1]["role"] == "assistant" else {}
        return llm.chat(messages, SamplingParams(temperature=0, **kw), **chat_kw)[0].outputs[0].text


def test_the_server_splits_the_offline_reply(client: openai.OpenAI, llm):
    text = _offline(llm, PATTERN, max_tokens=12)
    reasoning, content = ReasoningReader().read(text)
    assert reasoning and content  # the reply did close its reasoning
    resp = client.chat.completions.create(model=MODEL, messages=PATTERN, max_tokens=12,
                                          temperature=0, extra_body=CONTINUE)
    message = resp.choices[0].message
    assert (message.reasoning_content, message.content) == (reasoning, content)
    chunks = list(client.chat.completions.create(model=MODEL, messages=PATTERN, max_tokens=12,
                                                 temperature=0, stream=True,
                                                 extra_body=CONTINUE))
    deltas = [c.choices[0].delta for c in chunks]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == reasoning
    assert "".join(d.content or "" for d in deltas) == content
    hidden = client.chat.completions.create(model=MODEL, messages=PATTERN, max_tokens=12,
                                            temperature=0,
                                            extra_body={**CONTINUE, "include_reasoning": False})
    assert hidden.choices[0].message.content == content
    assert getattr(hidden.choices[0].message, "reasoning_content", None) is None


def test_a_reply_cut_short_is_all_reasoning(client: openai.OpenAI, llm):
    messages = [{"role": "user", "content": "Name three primary colors."}]
    text = _offline(llm, messages, max_tokens=8)
    resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                          temperature=0)
    message = resp.choices[0].message
    assert message.reasoning_content == text and message.content is None


def test_a_structured_answer_follows_free_reasoning(client: openai.OpenAI, llm):
    """Under a structured output the reasoning stays free and the answer after it is
    constrained (vLLM's rule), streamed or not; a forced tool call too."""
    want = _offline(llm, PATTERN, max_tokens=12,
                    structured_outputs=StructuredOutputsParams(choice=["YES"],
                                                               starts_after="</think>"))
    assert want == " c.</think>YES"  # free, the model wrote "Done."
    body = {"model": MODEL, "messages": PATTERN, "max_tokens": 12, "temperature": 0,
            "extra_body": {**CONTINUE, "structured_outputs": {"choice": ["YES"]}}}
    message = client.chat.completions.create(**body).choices[0].message
    assert (message.reasoning_content, message.content) == (" c.", "YES")
    deltas = [c.choices[0].delta for c in client.chat.completions.create(**body, stream=True)]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == " c."
    assert "".join(d.content or "" for d in deltas) == "YES"
    tools = [{"type": "function", "function": {"name": "answer", "parameters": {
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}}]
    resp = client.chat.completions.create(
        model=MODEL, messages=PATTERN, max_tokens=24, temperature=0, tools=tools,
        tool_choice={"type": "function", "function": {"name": "answer"}}, extra_body=CONTINUE)
    message = resp.choices[0].message
    assert message.reasoning_content == " c."
    assert isinstance(json.loads(message.tool_calls[0].function.arguments)["ok"], bool)


def test_a_response_of_reasoning_whole_and_streamed(client: openai.OpenAI, llm):
    """The Responses API on the same server: a reply cut short while reasoning is one
    reasoning item, its tokens counted, streamed as reasoning_text deltas."""
    messages = [{"role": "user", "content": "Name three primary colors."}]
    text = _offline(llm, messages, max_tokens=8)
    resp = client.responses.create(model=MODEL, input=messages[0]["content"], temperature=0,
                                   max_output_tokens=8)
    assert [o.type for o in resp.output] == ["reasoning"]
    assert resp.output[0].content[0].text == text
    assert 0 < resp.usage.output_tokens_details.reasoning_tokens <= 8
    events = list(client.responses.create(model=MODEL, input=messages[0]["content"],
                                          temperature=0, max_output_tokens=8, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == text
    assert events[-1].type == "response.incomplete"


def test_a_prompt_that_closes_the_reasoning_gets_an_answer(client: openai.OpenAI, llm):
    """A template asked not to think ends the prompt with </think>: the reply is all answer,
    and a structured output constrains it from its first token."""
    closed = [PATTERN[0], {"role": "assistant", "content": "Think: a b c.</think>"}]
    text = _offline(llm, closed, max_tokens=8)
    body = {"model": MODEL, "messages": closed, "max_tokens": 8, "temperature": 0,
            "extra_body": CONTINUE}
    message = client.chat.completions.create(**body).choices[0].message
    assert message.content == text and getattr(message, "reasoning_content", None) is None
    body["extra_body"] = {**CONTINUE, "structured_outputs": {"choice": ["YES"]}}
    message = client.chat.completions.create(**body).choices[0].message
    assert message.content == "YES"


def test_every_choice_is_split_even_when_the_first_has_no_reasoning(client: openai.OpenAI):
    """n = 2, each reply starting with </think> (its reasoning empty): both are read alike (the
    second was once read by choice 0's reasoning text, empty, taken for 'no reasoning')."""
    prefix = [PATTERN[0], {"role": "assistant", "content": PATTERN[1]["content"] + " c."}]
    resp = client.chat.completions.create(model=MODEL, messages=prefix, max_tokens=6, n=2,
                                          temperature=0, extra_body=CONTINUE)
    first, second = (c.message for c in resp.choices)
    assert not (first.content or "").startswith("</think>")
    assert (first.content, first.reasoning_content) == (second.content,
                                                        second.reasoning_content)
