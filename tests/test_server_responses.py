"""OpenAI's Responses API on a live server: every body and stream event validates against the
official client's own models, the text and calls equal the offline engine's (greedy, fp32), a
conversation with function calls and their outputs renders as its chat messages would, and
what a stateless server cannot do is refused."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from test_server import MODEL, MODEL_FLAGS, LiveServer, one_thread

from specserve import SamplingParams, StructuredOutputsParams
from specserve.outputs import CompletionOutput, RequestOutput
from specserve.server.response_events import ResponseEvents
from specserve.server.responses import ResponsesRequest
from specserve.server.tool_calls import CallDelta

EVENT = TypeAdapter(ResponseStreamEvent)
WEATHER = {"type": "object", "additionalProperties": False,
           "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
          "parameters": WEATHER}]
QUESTION = "What is the weather like in Paris today?"
FOLLOW_UP = "Now write one sentence about Paris."


@pytest.fixture(scope="module")
def server() -> LiveServer:
    live = LiveServer(*MODEL_FLAGS)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return server.client()


def offline(llm, messages: list[dict], **kw):
    with one_thread():
        return llm.chat(messages, SamplingParams(temperature=0, **kw))[0]


def post(server: LiveServer, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/responses", json={"model": MODEL, **body}, timeout=120)


def stream_events(server: LiveServer, body: dict) -> list[dict]:
    """The raw stream's events, each checked against its `event:` line and the client's model."""
    events, name = [], None
    with httpx.stream("POST", f"{server.url}/v1/responses", timeout=120,
                      json={"model": MODEL, "stream": True, **body}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                event = json.loads(line.removeprefix("data: "))
                assert event["type"] == name
                EVENT.validate_python(event)
                events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_text_is_the_offline_reply_whole_and_streamed(server: LiveServer, llm):
    messages = [{"role": "system", "content": "Answer in one sentence."},
                {"role": "user", "content": "Why is the sky blue?"}]
    want = offline(llm, messages, max_tokens=24)
    body = {"instructions": messages[0]["content"], "input": messages[1]["content"],
            "max_output_tokens": 24, "temperature": 0.0}
    resp = post(server, body).json()
    Response.model_validate(resp)
    text = want.outputs[0].text
    assert resp["output"][0]["content"][0]["text"] == text
    assert resp["usage"]["input_tokens"] == len(want.prompt_token_ids)
    assert resp["usage"]["output_tokens"] == len(want.outputs[0].token_ids)
    cut = want.outputs[0].finish_reason == "length"
    assert resp["status"] == ("incomplete" if cut else "completed")
    events = stream_events(server, body)
    kinds = [e["type"] for e in events]
    assert kinds[:5] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added",
                         "response.output_text.delta"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done",
                          "response.incomplete" if cut else "response.completed"]
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") \
        == text
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == text


def test_named_and_required_calls_whole_and_through_the_clients_stream(client, llm):
    want = offline(llm, [{"role": "user", "content": QUESTION}], max_tokens=48,
                   structured_outputs=StructuredOutputsParams(json=WEATHER)).outputs[0].text
    resp = client.responses.create(model=MODEL, input=QUESTION, tools=TOOLS, temperature=0,
                                   tool_choice={"type": "function", "name": "get_weather"},
                                   max_output_tokens=48)
    (call,) = resp.output
    assert (call.type, call.name, call.arguments) == ("function_call", "get_weather", want)
    assert call.call_id.startswith("call_") and resp.status == "completed"
    with client.responses.stream(model=MODEL, input=QUESTION, tools=TOOLS, temperature=0,
                                 tool_choice="required", max_output_tokens=64) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    assert [o.type for o in final.output] == ["function_call"]
    assert final.output[0].name == "get_weather" and set(json.loads(final.output[0].arguments)) \
        == {"city"}


def test_a_conversation_with_calls_renders_as_its_chat_messages(server: LiveServer, llm):
    arguments = '{"city": "Paris"}'
    items = [{"role": "user", "content": QUESTION},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather",
              "arguments": arguments},
             {"type": "function_call_output", "call_id": "call_1", "output": "18 C, sunny"},
             {"role": "user", "content": [{"type": "input_text", "text": FOLLOW_UP}]}]
    messages = [{"role": "user", "content": QUESTION},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": json.loads(arguments)}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
                {"role": "user", "content": FOLLOW_UP}]
    want = offline(llm, messages, max_tokens=16)
    resp = post(server, {"input": items, "max_output_tokens": 16, "temperature": 0.0}).json()
    assert resp["usage"]["input_tokens"] == len(want.prompt_token_ids)
    assert resp["output"][0]["content"][0]["text"] == want.outputs[0].text != ""


def test_text_format_json_schema(server: LiveServer, llm):
    want = offline(llm, [{"role": "user", "content": QUESTION}], max_tokens=48,
                   structured_outputs=StructuredOutputsParams(json=WEATHER)).outputs[0].text
    resp = post(server, {"input": QUESTION, "max_output_tokens": 48, "temperature": 0.0,
                         "text": {"format": {"type": "json_schema", "name": "weather",
                                             "schema": WEATHER, "strict": True}}}).json()
    Response.model_validate(resp)
    assert resp["output"][0]["content"][0]["text"] == want
    assert resp["text"]["format"]["type"] == "json_schema"


@pytest.mark.parametrize(("body", "words"), [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "background": True}, "background"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input"),
    ({"input": []}, "input"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "x", "include": ["message.output_text.logprobs"]}, "logprobs"),
    ({"input": "x", "include": 1}, "include"),
    ({"input": "x", "max_tool_calls": 2}, "max_tool_calls"),
    ({"input": "x", "tools": TOOLS}, "--tool-call-parser"),  # "auto": this server has none
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}, "schema"),
    ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input"),
])
def test_refused_with_a_400(server: LiveServer, body: dict, words: str):
    resp = post(server, body)
    assert resp.status_code == 400, resp.text
    assert words in json.dumps(resp.json()["error"])


def test_events_of_reasoning_text_and_calls_in_order():
    """The stream's item bookkeeping without a model: reasoning, then text, then two calls
    (the second in two parts); every event validates and the final output lists the items."""
    req = ResponsesRequest.model_validate({"input": "x", "tools": TOOLS,
                                           "tool_choice": "required"})
    events = ResponseEvents("resp_x", MODEL, req, cache_block=16,
                            count_tokens=lambda text: len(text.split()))
    out = events.start() + events.feed("Think", "", []) + events.feed(" more.", "", [])
    out += events.feed("", "Sure.", [CallDelta(0, '{"city": "Oslo"}', "call_a", "get_weather"),
                                     CallDelta(1, '{"city": ', "call_b", "get_weather")])
    out += events.feed("", "", [CallDelta(1, '"Rome"}')])
    out += events.finish(RequestOutput("r", None, [1, 2], [CompletionOutput(0, "", [5, 6],
                                                                            finish_reason="stop")],
                                       True))
    for event in out:
        EVENT.validate_python(event)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    final = out[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call",
                                                   "function_call"]
    assert final["output"][0]["content"][0]["text"] == "Think more."
    assert [i["arguments"] for i in final["output"][2:]] == ['{"city": "Oslo"}',
                                                             '{"city": "Rome"}']
    added = [e["output_index"] for e in out if e["type"] == "response.output_item.added"]
    assert added == [0, 1, 2, 3]
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 2  # "Think more."
    # Cut short: the open item and the response are incomplete, the closed ones complete.
    cut = ResponseEvents("resp_y", MODEL, req, cache_block=None, count_tokens=len)
    out = cut.start() + cut.feed("", "Sure.", [CallDelta(0, '{"ci', "call_c", "get_weather")])
    out += cut.finish(RequestOutput("r", None, [1], [CompletionOutput(0, "", [5, 6],
                                                                      finish_reason="length")],
                                    True))
    for event in out:
        EVENT.validate_python(event)
    assert out[-1]["type"] == "response.incomplete"
    assert [i["status"] for i in out[-1]["response"]["output"]] == ["completed", "incomplete"]
    assert out[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_named_call_after_reasoning_streams_as_one_reasoning_item_then_the_call():
    """tool_choice names a function and the reply reasons first, over several steps: the
    call's item opens with its first argument text, after the reasoning (its header, sent on
    the first empty step, opened the call before the reasoning that followed, and the
    arguments went into a second reasoning item)."""
    from specserve.server.reasoning import ReasoningReader
    from specserve.server.replies import ReplyReader
    from specserve.server.tool_calls import NamedCall

    req = ResponsesRequest.model_validate({"input": "x", "tools": TOOLS, "tool_choice": {
        "type": "function", "name": "get_weather"}})
    reader = ReplyReader(ReasoningReader(), NamedCall("get_weather"))
    events = ResponseEvents("resp_n", MODEL, req, cache_block=None, count_tokens=len)
    out = events.start()
    steps = ["<think>Let me", " think", ".</think>", '{"city": ', '"Paris"}']
    for i, step in enumerate(steps):
        out += events.feed(*reader.feed(step, i == len(steps) - 1))
    out += events.finish(RequestOutput("r", None, [1], [CompletionOutput(0, "", [5] * 5,
                                                                         finish_reason="stop")],
                                       True))
    for event in out:
        EVENT.validate_python(event)
    final = out[-1]["response"]["output"]
    assert [i["type"] for i in final] == ["reasoning", "function_call"]
    assert final[0]["content"][0]["text"] == "Let me think."
    assert json.loads(final[1]["arguments"]) == {"city": "Paris"}


def test_the_reasoning_is_counted_by_the_callers_tokenizer_not_on_the_event_loop():
    # A long reasoning was re-tokenized on the event loop at the end of every reply; the
    # server now gives the texts to its tokenizing thread (serving.count).
    import asyncio

    from specserve.server.response_events import whole_response

    def on_the_loop(text):
        raise AssertionError("counted on the event loop")

    seen = []

    async def count(texts):
        seen.append(texts)
        return 7

    req = ResponsesRequest.model_validate({"input": "x"})
    events = ResponseEvents("resp_r", MODEL, req, cache_block=None, count_tokens=on_the_loop)
    events.start()
    out = RequestOutput("r", None, [1], [CompletionOutput(0, "<think>Hm, so.</think>Yes.",
                                                          [5] * 9, finish_reason="stop")], True)
    from specserve.server.reasoning import ReasoningReader
    from specserve.server.replies import ReplyReader

    final = asyncio.run(whole_response(events, out, ReplyReader(ReasoningReader(), None), count))
    assert seen == [["Hm, so."]]
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 7


def test_a_named_call_cut_short_while_reasoning_makes_no_call():
    # An agent runs every function_call item: one the model never began (arguments "") used
    # to be invented at the end, and the cut reasoning marked completed.
    from specserve.server.reasoning import ReasoningReader
    from specserve.server.replies import ReplyReader
    from specserve.server.tool_calls import NamedCall

    req = ResponsesRequest.model_validate({"input": "x", "tools": TOOLS, "tool_choice": {
        "type": "function", "name": "get_weather"}})
    reader = ReplyReader(ReasoningReader(), NamedCall("get_weather"))
    events = ResponseEvents("resp_c", MODEL, req, cache_block=None, count_tokens=len)
    out = events.start()
    steps = ["<think>Let me", " think"]
    for i, step in enumerate(steps):
        out += events.feed(*reader.feed(step, i == len(steps) - 1))
    out += events.finish(RequestOutput("r", None, [1], [CompletionOutput(
        0, "", [5] * 2, finish_reason="length")], True))
    final = out[-1]["response"]
    assert [(i["type"], i["status"]) for i in final["output"]] == [("reasoning", "incomplete")]
    assert final["status"] == "incomplete"
    assert NamedCall("f").read("") == (None, [])


def test_an_assistants_text_and_calls_are_one_turn():
    req = ResponsesRequest.model_validate({"input": [
        {"role": "user", "content": "Weather?"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Let me check."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
        "instructions": "Be brief."})
    roles = [(m.role, m.content, [c.id for c in m.tool_calls or ()]) for m in req.chat.messages]
    assert roles == [("system", "Be brief.", []), ("user", "Weather?", []),
                     ("assistant", "Let me check.", ["c1", "c2"]), ("tool", "sunny", [])]
