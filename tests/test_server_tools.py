"""Tool calls on the chat endpoint: the readers that turn a reply into content and calls
(streamed in any pieces, they give what the whole reply gives), the schema that forces calls,
the chat template's view of tools and earlier calls, and a live server with the hermes parser
and a template that lists the tools, checked against the offline engine (greedy, fp32)."""

from __future__ import annotations

import copy
import json
import random
import re

import httpx
import openai
import pytest
from test_server import MODEL, MODEL_FLAGS, LiveServer, one_thread

from specserve import SamplingParams, StructuredOutputsParams
from specserve.engine.prompts import encode_chat, render_chat
from specserve.server.tool_calls import (
    HermesCalls,
    Llama3JsonCalls,
    NamedCall,
    RequiredCalls,
    arguments_schema,
    calls_schema,
    merge_calls,
)

WEATHER = {"type": "object", "additionalProperties": False,
           "properties": {"city": {"type": "string", "maxLength": 20},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
CLOCK = {"type": "object", "additionalProperties": False,
         "properties": {"timezone": {"type": "string", "maxLength": 20}},
         "required": ["timezone"]}
# Fields in OpenAI's order, the order the server gives them to the template (as vLLM does).
TOOLS = [{"type": "function", "function": {"name": "get_weather",
                                           "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": CLOCK}}]
MESSAGES = [{"role": "user", "content": "What is the weather like in Paris today?"}]
# ChatML, as SmolLM2's own template, but listing the tools and earlier calls the way Hermes
# and Qwen templates do (SmolLM2's ignores both).
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou can call these functions. To call one, write "
    '<tool_call>{"name": ..., "arguments": {...}}</tool_call>.\n'
    "{%- for tool in tools %}\n{{ tool.function | tojson }}{%- endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.tool_calls %}{%- for c in m.tool_calls %}\n<tool_call>\n"
    '{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}\n</tool_call>'
    "{%- endfor %}{%- else %}\n{{ m.content }}{%- endif %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


# ---- the readers -----------------------------------------------------------------------------
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
REPLIES = [
    "No call here, just text. \n",
    "Let me look.\n" + CALL,
    CALL + "\n" + CALL.replace("Paris", "Oslo") + "\n",
    "Before. " + CALL + " and after.",
    '<tool_call>{"nme": "x"}</tool_call> kept as text',  # not a call: stays content
    "cut short " + CALL[:30],  # an unclosed call (max_tokens): content
    "ends with a partial tag <tool_c",
    "<tool_call>{\"name\": \"get_time\", \"arguments\": \"{\\\"timezone\\\": \\\"UTC\\\"}\"}"
    "</tool_call>",  # arguments already JSON text
]


def _streamed(reader, text: str, cuts: list[int]) -> tuple[str | None, list]:
    content, parts = [], []
    for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
        c, p = reader.feed(text[a:b])
        content.append(c)
        parts += p
    c, p = reader.finish()
    return "".join(content) + c or None, parts + p


@pytest.mark.parametrize("text", REPLIES)
def test_hermes_reply_streamed_in_any_pieces_reads_as_the_whole(text: str):
    content, parts = HermesCalls().read(text)
    calls = [(name, args) for _, name, args in merge_calls(parts)]
    rng = random.Random(0)
    for cuts in [list(range(1, len(text))), *(
            sorted(rng.sample(range(1, len(text)), k)) for k in (1, 3, 7))]:
        got_content, got_parts = _streamed(HermesCalls(), text, cuts)
        assert got_content == content
        assert [(name, args) for _, name, args in merge_calls(got_parts)] == calls
    if "<tool_call>" not in text:
        assert content == text  # no call: the text as the model wrote it


LLAMA3_REPLIES = [
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    '<|python_tag|>{"name": "get_time", "parameters": {"timezone": "UTC"}}; '
    '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
    "  The weather is fine.",  # text: streamed as written
    "<|not_a_tag|> text",
    '{"name": "get_weather", "parameters": {"city": "Par',  # cut short: text
    '{"city": "Paris"}',  # JSON, but not a call: text
]


@pytest.mark.parametrize("text", LLAMA3_REPLIES)
def test_llama3_json_reply_streamed_in_any_pieces_reads_as_the_whole(text: str):
    content, parts = Llama3JsonCalls().read(text)
    calls = [(name, args) for _, name, args in merge_calls(parts)]
    for cuts in [list(range(1, len(text))), [5], [1, 2, 3]]:
        got_content, got_parts = _streamed(Llama3JsonCalls(), text, cuts)
        assert got_content == content
        assert [(name, args) for _, name, args in merge_calls(got_parts)] == calls
    assert (content, calls) == {
        0: (None, [("get_weather", '{"city": "Paris"}')]),
        1: (None, [("get_time", '{"timezone": "UTC"}'), ("get_weather", '{"city": "Oslo"}')]),
    }.get(LLAMA3_REPLIES.index(text), (text, []))
    if not text.lstrip().startswith(("{", "<|python_tag|>")):  # text goes out as it comes
        assert Llama3JsonCalls().feed(text) == (text, [])


def test_hermes_reply_contents_and_calls():
    expected = {
        REPLIES[1]: ("Let me look.", [("get_weather", '{"city": "Paris"}')]),
        REPLIES[2]: (None, [("get_weather", '{"city": "Paris"}'),
                            ("get_weather", '{"city": "Oslo"}')]),
        REPLIES[3]: ("Before.  and after.", [("get_weather", '{"city": "Paris"}')]),
        REPLIES[4]: (REPLIES[4], []),
        REPLIES[5]: (REPLIES[5], []),
        REPLIES[7]: (None, [("get_time", '{"timezone": "UTC"}')]),
    }
    for text, (content, calls) in expected.items():
        got_content, parts = HermesCalls().read(text)
        assert (got_content, [(n, a) for _, n, a in merge_calls(parts)]) == (content, calls)
        ids = [i for i, _, _ in merge_calls(parts)]
        assert len(set(ids)) == len(ids) and all(i.startswith("call_") for i in ids)


def test_hermes_edge_cases():
    # A call that does not parse keeps the whitespace before it: the text as written.
    assert HermesCalls().read("  <tool_call>bad</tool_call>") == (
        "  <tool_call>bad</tool_call>", [])
    # parallel_tool_calls false: the first call only (vLLM keeps the first too).
    content, parts = HermesCalls(max_calls=1).read(REPLIES[2])
    assert content is None and [n for _, n, _ in merge_calls(parts)] == ["get_weather"]
    assert json.loads(merge_calls(parts)[0][2]) == {"city": "Paris"}
    # A lone surrogate escape stays escaped (UTF-8 cannot carry it); NaN is not JSON.
    content, parts = HermesCalls().read(
        '<tool_call>{"name": "f", "arguments": {"x": "\\ud800 é"}}</tool_call>')
    arguments = merge_calls(parts)[0][2]
    assert arguments == '{"x": "\\ud800 \\u00e9"}' and arguments.encode("utf-8")
    nan = '<tool_call>{"name": "f", "arguments": {"x": NaN}}</tool_call>'
    assert HermesCalls().read(nan) == (nan, [])
    # Arguments given as a string holding a lone surrogate: not a call, the text stays.
    lone = '<tool_call>{"name": "f", "arguments": "\\ud800"}</tool_call>'
    assert HermesCalls().read(lone) == (lone, [])
    assert Llama3JsonCalls().read('{"name": "f", "parameters": "\\udc00"}')[1] == []
    # Nesting too deep to read is not a call, not an error.
    deep = "<tool_call>" + "[" * 100_000 + "</tool_call>"
    assert HermesCalls().read(deep) == (deep, [])
    assert RequiredCalls().read("[" * 100_000) == ("[" * 100_000, [])
    assert Llama3JsonCalls().read("{" * 100_000)[1] == []
    # Arguments that are not an object, nor an object's JSON text: not a call (a client's
    # json.loads would fail on them, and the turn sent back would be refused).
    for arguments in ('"Paris"', "null", "[1]", "5", '"[1]"'):
        text = f'<tool_call>{{"name": "f", "arguments": {arguments}}}</tool_call>'
        assert HermesCalls().read(text) == (text, []), arguments
    assert Llama3JsonCalls().read('{"name": "f", "parameters": "x"}')[1] == []


def test_a_long_call_is_read_in_pieces_as_whole():
    """A call's body arrives over many steps; its closing tag split across them."""
    body = '{"name": "f", "arguments": {"text": "' + "word " * 2000 + '"}}'
    text = "<tool_call>" + body + "</tool_call>"
    for step in (1, 3, 7):
        content, parts = _streamed(HermesCalls(), text, list(range(step, len(text), step)))
        assert content is None and merge_calls(parts)[0][2] == json.dumps(
            json.loads(body)["arguments"])


def test_named_and_required_readers():
    reader = NamedCall("get_weather")
    _, parts = _streamed(reader, '{"city": "Paris"}', [3, 9])
    assert parts[0].id and parts[0].name == "get_weather"
    assert all(p.id is None and p.name is None for p in parts[1:])  # only the first names it
    assert merge_calls(parts)[0][1:] == ("get_weather", '{"city": "Paris"}')
    content, parts = RequiredCalls().read(
        '[{"name": "get_time", "parameters": {"timezone": "UTC"}}, '
        '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "celsius"}}]')
    assert content is None and [(n, json.loads(a)) for _, n, a in merge_calls(parts)] == [
        ("get_time", {"timezone": "UTC"}), ("get_weather", {"city": "Oslo", "unit": "celsius"})]
    # Cut short by max_tokens: the calls begun, the last with the parameters written so far;
    # before any name, the text.
    cut = '[{"name": "get_time", "parameters": {"timez'
    assert [(n, a) for _, n, a in merge_calls(RequiredCalls().read(cut)[1])] == [
        ("get_time", '{"timez')]
    assert RequiredCalls().read('[{"na') == ('[{"na', [])


REQUIRED_REPLIES = [
    '[{"name": "get_time", "parameters": {"timezone": "UTC"}}, '
    '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "celsius"}}]',
    '[\n  {\n    "name": "f",\n    "parameters": {"a": [1, {"b": "x}]\\"y"}], "c": null}\n  }\n]',
    '[{"parameters": {"z": 1}, "name": "late"}, {"name": "b", "parameters": {}}]',  # first
    '[{"name": "n", "parameters": 5}, {"name": "m", "parameters": "s,}"}]',
    '[{"name": "caf\\u00e9", "parameters": {}}]',
]


@pytest.mark.parametrize("text", REQUIRED_REPLIES)
def test_required_calls_stream_as_they_are_written(text: str):
    """Streamed at every character and at random cuts, the calls are the whole reply's; their
    arguments are the parameters' own JSON text; a call goes out before the reply ends."""
    content, parts = RequiredCalls().read(text)
    calls = [(n, a) for _, n, a in merge_calls(parts)]
    assert content is None
    assert [(n, json.loads(a)) for n, a in calls] == [(c["name"], c["parameters"])
                                                      for c in json.loads(text)]
    rng = random.Random(2)
    for cuts in [list(range(1, len(text))), sorted(rng.sample(range(1, len(text)), 4))]:
        got_content, got_parts = _streamed(RequiredCalls(), text, cuts)
        assert (got_content, [(n, a) for _, n, a in merge_calls(got_parts)]) == (None, calls)
    reader = RequiredCalls()
    early = [p for c in text[:-2] for p in reader.feed(c)[1]]
    assert early and early[0].name == calls[0][0]


def test_calls_schema_repoints_references_and_compiles(llm):
    """A recursive tool ("#") and one with definitions: the nested schemas compile, and the
    engine's replies under them follow the tools' own schemas."""
    tree = {"type": "object", "properties": {
        "label": {"type": "string", "maxLength": 8},
        "children": {"type": "array", "maxItems": 1, "items": {"$ref": "#"}}},
        "required": ["label", "children"], "additionalProperties": False}
    place = {"type": "object", "properties": {"where": {"$ref": "#/$defs/Place"}},
             "required": ["where"], "$defs": {"Place": {"enum": ["home", "work"]}}}
    schema = calls_schema([("tree", tree), ("go", place)])
    assert schema["items"]["anyOf"][0]["properties"]["parameters"]["properties"]["children"][
        "items"] == {"$ref": "#/items/anyOf/0/properties/parameters"}
    out = llm.chat(MESSAGES, SamplingParams(
        temperature=0, max_tokens=96,
        structured_outputs=StructuredOutputsParams(json=schema)))[0].outputs[0]
    # The model grows the tree until max_tokens; its children are trees, not calls (as they
    # were when "#" pointed at the array of calls).
    assert re.match(r'\[\s*\{\s*"name":\s*"tree"', out.text)
    assert re.search(r'"children":\s*\[\s*\{\s*"label"', out.text)
    go = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=96, structured_outputs=(
        StructuredOutputsParams(json=calls_schema([("go", place)])))))[0].outputs[0]
    assert json.loads(go.text)[0]["parameters"]["where"] in ("home", "work")


def test_required_request_constrains_to_calls_of_its_tools():
    from specserve.server.protocol import ChatCompletionRequest

    body = {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "required"}
    schema = ChatCompletionRequest.model_validate(body)._structured.json
    assert [v["properties"]["name"]["enum"] for v in schema["items"]["anyOf"]] == [
        ["get_weather"], ["get_time"]]
    assert "maxItems" not in schema
    one = ChatCompletionRequest.model_validate({**body, "parallel_tool_calls": False})
    assert one._structured.json["maxItems"] == 1
    named = ChatCompletionRequest.model_validate(
        {**body, "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    assert named._structured.json == CLOCK


def test_calls_schema_moves_definitions_to_its_root():
    with_defs = {"type": "object", "properties": {"where": {"$ref": "#/$defs/Place"}},
                 "$defs": {"Place": {"type": "string"}}}
    schema = calls_schema([("a", with_defs), ("b", None)], parallel=False)
    assert schema["$defs"] == {"Place": {"type": "string"}} and schema["maxItems"] == 1
    a, b = schema["items"]["anyOf"]
    assert "$defs" not in a["properties"]["parameters"]
    assert b["properties"]["parameters"] == arguments_schema(None)
    assert "maxItems" not in calls_schema([("a", None)])
    clash = {"$defs": {"Place": {"type": "integer"}}}
    with pytest.raises(ValueError, match="differently"):
        calls_schema([("a", with_defs), ("b", clash)])


def test_template_sees_tools_and_earlier_calls_with_object_arguments(llm):
    tok = copy.deepcopy(llm.get_tokenizer())
    tok.chat_template = TEMPLATE
    earlier = [*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    text = render_chat(tok, earlier, tools=TOOLS)
    assert json.dumps(TOOLS[0]["function"]) in text
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "get_weather" not in render_chat(tok, MESSAGES)


def test_template_sees_documents_from_the_field_or_its_kwargs(llm):
    """RAG documents reach a template that lists them (SmolLM2's ignores them), from the
    request's field or from chat_template_kwargs, as vLLM passes them."""
    tok = copy.deepcopy(llm.get_tokenizer())
    tok.chat_template = ("{% for d in documents or [] %}[{{ d.title }}: {{ d.text }}]{% endfor %}"
                         "{% for m in messages %}{{ m.content }}{% endfor %}")
    docs = [{"title": "Paris", "text": "18 C and sunny."}]
    want = "[Paris: 18 C and sunny.]" + MESSAGES[0]["content"]
    assert render_chat(tok, MESSAGES, documents=docs) == want
    assert render_chat(tok, MESSAGES, template_kwargs={"documents": docs}) == want
    assert render_chat(tok, MESSAGES) == MESSAGES[0]["content"]


# ---- a live server ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory) -> LiveServer:
    template = tmp_path_factory.mktemp("tools") / "tools.jinja"
    template.write_text(TEMPLATE)
    live = LiveServer(*MODEL_FLAGS, "--chat-template", str(template),
                      "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return server.client()


@pytest.fixture(scope="module")
def offline(llm):
    """The offline engine's greedy reply to a conversation rendered with TEMPLATE."""
    tok = copy.deepcopy(llm.get_tokenizer())
    tok.chat_template = TEMPLATE

    def generate(messages: list[dict], tools: list[dict] | None = None, **kw):
        ids = encode_chat(tok, messages, tools=tools)
        with one_thread():
            out = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, **kw))
        return out[0]
    return generate


def _json_params(schema: dict) -> StructuredOutputsParams:
    return StructuredOutputsParams(json=schema)


def test_named_call_is_the_offline_engines_arguments(client: openai.OpenAI, offline):
    want = offline(MESSAGES, TOOLS, max_tokens=64,
                   structured_outputs=_json_params(WEATHER)).outputs[0]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    resp = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                          tool_choice=choice, max_tokens=64, temperature=0)
    message = resp.choices[0].message
    assert message.content is None and len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call.function.name == "get_weather" and call.function.arguments == want.text
    assert set(json.loads(call.function.arguments)) == {"city", "unit"}
    assert resp.choices[0].finish_reason == want.finish_reason == "stop"  # OpenAI's, named
    # Streamed: the id and name once, then the arguments as they are generated.
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=64,
        temperature=0, stream=True))
    parts = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
    assert len(parts) > 1 and parts[0].id and parts[0].function.name == "get_weather"
    assert all(p.id is None and p.function.name is None for p in parts[1:])
    assert "".join(p.function.arguments for p in parts) == want.text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_required_calls_are_the_offline_engines(client: openai.OpenAI, offline):
    tools = [(t["function"]["name"], t["function"]["parameters"]) for t in TOOLS]
    for parallel in (True, False):
        want = offline(MESSAGES, TOOLS, max_tokens=96,
                       structured_outputs=_json_params(calls_schema(tools, parallel)))
        expected = [(c["name"], c["parameters"]) for c in json.loads(want.outputs[0].text)]
        resp = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS,
                                              tool_choice="required", max_tokens=96,
                                              temperature=0, parallel_tool_calls=parallel)
        message = resp.choices[0].message
        assert message.content is None and resp.choices[0].finish_reason == "tool_calls"
        assert [(c.function.name, json.loads(c.function.arguments))
                for c in message.tool_calls] == expected
        assert parallel or len(expected) == 1


def test_required_calls_streamed_and_n_choices_with_logprobs(client: openai.OpenAI):
    body = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required",
            "max_tokens": 96, "temperature": 0}
    whole = client.chat.completions.create(**body).choices[0].message.tool_calls
    chunks = list(client.chat.completions.create(**body, stream=True))
    parts = [p for c in chunks for p in c.choices[0].delta.tool_calls or ()]
    streamed = [(p.index, p.function.name, "".join(
        q.function.arguments or "" for q in parts if q.index == p.index)) for p in parts if p.id]
    assert streamed == [(k, c.function.name, c.function.arguments)
                        for k, c in enumerate(whole)]
    assert len(parts) > len(whole)  # the parameters went out as they were written
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # Two sampled choices of a named call, streamed with logprobs: each its own call.
    choice = {"type": "function", "function": {"name": "get_weather"}}
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=64,
        temperature=1.0, seed=4, n=2, logprobs=True, stream=True))
    for i in range(2):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        parts = [p for c in mine for p in c.delta.tool_calls or ()]
        assert parts[0].id and all(p.index == 0 for p in parts)
        text = "".join(p.function.arguments for p in parts)
        assert set(json.loads(text)) == {"city", "unit"}
        # The logprobs cover the reply's tokens, in the chunks that carry them.
        tokens = "".join(t.token for c in mine if c.logprobs for t in c.logprobs.content)
        assert tokens.removesuffix("<|im_end|>") == text


# The hermes parser reads the model's own calls. A 135M model does not write any, so the reply is
# forced to one (a structured output) here; the parser and server cannot tell the difference.
FORCED = "Sure. " + CALL.replace('"Paris"}', '"Paris", "unit": "celsius"}')


def test_auto_reads_the_models_own_calls_streamed_and_not(client: openai.OpenAI, offline):
    want = offline(MESSAGES, TOOLS, max_tokens=128, skip_special_tokens=False,
                   structured_outputs=StructuredOutputsParams(choice=[FORCED])).outputs[0]
    assert want.text == FORCED
    body = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "max_tokens": 128,
            "temperature": 0, "extra_body": {"structured_outputs": {"choice": [FORCED]}}}
    resp = client.chat.completions.create(**body)
    message = resp.choices[0].message
    assert message.content == "Sure." and resp.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] \
        == [("get_weather", {"city": "Paris", "unit": "celsius"})]
    chunks = list(client.chat.completions.create(**body, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    parts = [p for c in chunks for p in c.choices[0].delta.tool_calls or ()]
    assert content == "Sure." and len(parts) == 1
    assert (parts[0].function.name, parts[0].function.arguments) == (
        "get_weather", message.tool_calls[0].function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_without_parallel_calls_keeps_the_first(client: openai.OpenAI):
    two = FORCED + "\n" + CALL.replace('"Paris"}', '"Oslo", "unit": "celsius"}')
    body = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "max_tokens": 200,
            "temperature": 0, "extra_body": {"structured_outputs": {"choice": [two]}}}
    calls = client.chat.completions.create(**body).choices[0].message.tool_calls
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Oslo"]
    one = client.chat.completions.create(**body, parallel_tool_calls=False)
    assert [json.loads(c.function.arguments)["city"]
            for c in one.choices[0].message.tool_calls] == ["Paris"]


def test_auto_without_a_call_is_the_offline_text(client: openai.OpenAI, offline):
    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    want = offline(messages, TOOLS, max_tokens=24, skip_special_tokens=False).outputs[0]
    content, parts = HermesCalls().read(want.text)
    resp = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                          max_tokens=24, temperature=0)
    message = resp.choices[0].message
    assert message.content == content and not parts and message.tool_calls is None
    assert resp.choices[0].finish_reason == want.finish_reason
    # tool_choice "none": the same prompt (the tools are still listed), read as text.
    none = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                          tool_choice="none", max_tokens=24, temperature=0)
    assert none.choices[0].message.content == offline(messages, TOOLS,
                                                      max_tokens=24).outputs[0].text


def test_a_conversation_with_earlier_calls_is_rendered_as_offline(server: LiveServer,
                                                                  client: openai.OpenAI,
                                                                  offline):
    messages = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"}]
    # Offline, a template reads an earlier call's arguments as an object.
    as_template = copy.deepcopy(messages)
    as_template[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    as_template[1]["content"] = ""
    want = offline(as_template, TOOLS, max_tokens=24)
    resp = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                          tool_choice="none", max_tokens=24, temperature=0)
    assert resp.choices[0].message.content == want.outputs[0].text
    assert resp.usage.prompt_tokens == len(want.prompt_token_ids)
    counted = httpx.post(f"{server.url}/tokenize", timeout=60,
                         json={"messages": messages, "tools": TOOLS}).json()
    assert counted["tokens"] == want.prompt_token_ids
