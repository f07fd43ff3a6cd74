"""The live server refusing what it should: malformed requests (a 4xx with an OpenAI error body,
never a 500), a missing or wrong API key, overload past --max-queue; SIGTERM, its timeout and a
second Ctrl-C.

One small server with the flags these need (an API key, room for 2 running + 2 waiting requests,
a served model name of its own), separate from test_server.py's; the last two shutdown tests
start one more each."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from test_server import MODEL, MODEL_FLAGS, LiveServer, kv_pool_is_free, wait_until

KEY = "sk-test-key"
NAME = "tiny"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    live = LiveServer(*MODEL_FLAGS, "--api-key", KEY, "--max-num-seqs", "2", "--max-queue", "2",
                      "--served-model-name", NAME, "--shutdown-timeout", "10")
    yield live
    live.stop()


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def completion(**fields) -> dict:
    return {"model": NAME, "prompt": "Hello", "max_tokens": 4, **fields}


def chat(**fields) -> dict:
    return {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            **fields}


CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
JSON = "application/json"
_missing_prompt = completion()
del _missing_prompt["prompt"]

BAD_REQUESTS = [
    # (path, body: a JSON value or raw bytes, content type, expected status)
    pytest.param(CMPL, _missing_prompt, JSON, 400, id="missing-prompt"),
    pytest.param(CMPL, completion(prompt=123), JSON, 400, id="prompt-wrong-type"),
    pytest.param(CMPL, completion(prompt=[]), JSON, 400, id="prompt-empty-list"),
    pytest.param(CMPL, completion(prompt=""), JSON, 400, id="prompt-empty-string"),
    pytest.param(CMPL, completion(prompt=[-1, 5]), JSON, 400, id="prompt-negative-token"),
    pytest.param(CMPL, completion(prompt=[10**9]), JSON, 400, id="prompt-token-out-of-vocab"),
    pytest.param(CMPL, completion(prompt=[1] * 6000), JSON, 400, id="prompt-over-context"),
    pytest.param(CMPL, completion(max_tokens="5"), JSON, 400, id="max-tokens-string"),
    pytest.param(CMPL, completion(max_tokens=0), JSON, 400, id="max-tokens-zero"),
    pytest.param(CMPL, completion(max_tokens=-3), JSON, 400, id="max-tokens-negative"),
    pytest.param(CMPL, completion(max_tokens=10**9), JSON, 400, id="max-tokens-huge"),
    pytest.param(CMPL, completion(max_tokens=2.5), JSON, 400, id="max-tokens-float"),
    pytest.param(CMPL, completion(temperature=-0.5), JSON, 400, id="temperature-negative"),
    pytest.param(CMPL, completion(temperature=50), JSON, 400, id="temperature-huge"),
    pytest.param(CMPL, completion(temperature="hot"), JSON, 400, id="temperature-string"),
    pytest.param(CMPL, completion(top_p=0), JSON, 400, id="top-p-zero"),
    pytest.param(CMPL, completion(top_p=1.5), JSON, 400, id="top-p-over-one"),
    pytest.param(CMPL, completion(top_k=-2), JSON, 400, id="top-k-negative"),
    pytest.param(CMPL, completion(n=0), JSON, 400, id="n-zero"),
    pytest.param(CMPL, completion(n=100000), JSON, 400, id="n-huge"),
    pytest.param(CMPL, completion(n=True), JSON, 400, id="n-bool"),
    pytest.param(CMPL, completion(n=5), JSON, 400, id="n-beyond-server-capacity"),
    pytest.param(CMPL, completion(stop=5), JSON, 400, id="stop-int"),
    pytest.param(CMPL, completion(stop=[""]), JSON, 400, id="stop-empty-string"),
    pytest.param(CMPL, completion(stop=["a", 7]), JSON, 400, id="stop-list-with-int"),
    pytest.param(CMPL, completion(logprobs=50), JSON, 400, id="logprobs-too-many"),
    pytest.param(CMPL, completion(logprobs=-1), JSON, 400, id="logprobs-negative"),
    pytest.param(CMPL, completion(seed="abc"), JSON, 400, id="seed-string"),
    pytest.param(CMPL, completion(seed=2**70), JSON, 400, id="seed-over-64-bits"),
    pytest.param(CMPL, completion(stream="yes"), JSON, 400, id="stream-string"),
    pytest.param(CMPL, completion(stream_options={"include_usage": True}), JSON, 400,
                 id="stream-options-without-stream"),
    pytest.param(CMPL, completion(speculation=99), JSON, 400, id="speculation-too-large"),
    pytest.param(CMPL, completion(speculation={"num_speculative_tokens": -1}), JSON, 400,
                 id="speculation-negative"),
    pytest.param(CMPL, completion(prompt_logprobs=1, stream=True), JSON, 400,
                 id="prompt-logprobs-with-stream"),
    pytest.param(CMPL, completion(prompt_logprobs=21), JSON, 400, id="prompt-logprobs-too-many"),
    pytest.param("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]},
                 JSON, 400, id="tokenize-prompt-and-messages"),
    pytest.param("/tokenize", {}, JSON, 400, id="tokenize-nothing"),
    pytest.param(CMPL, completion(truncate_prompt_tokens=0), JSON, 400,
                 id="truncate-prompt-tokens-zero"),
    pytest.param("/tokenize", {"messages": [{"role": "user", "content": "b"}],
                               "tools": [{"type": "function"}]}, JSON, 400,
                 id="tokenize-tool-without-function"),
    pytest.param("/tokenize", {"model": "nope", "prompt": "a"}, JSON, 404,
                 id="tokenize-unknown-model"),
    pytest.param("/detokenize", {"tokens": [10**9]}, JSON, 400, id="detokenize-out-of-vocab"),
    pytest.param("/detokenize", {"tokens": "abc"}, JSON, 400, id="detokenize-not-a-list"),
    pytest.param(CMPL, completion(presence_penalty=3), JSON, 400, id="presence-penalty-huge"),
    pytest.param(CMPL, completion(repetition_penalty=0), JSON, 400,
                 id="repetition-penalty-zero"),
    pytest.param(CMPL, completion(logit_bias={"abc": 1}), JSON, 400, id="logit-bias-bad-key"),
    pytest.param(CMPL, completion(logit_bias={"-4": 1}), JSON, 400,
                 id="logit-bias-negative-token"),
    pytest.param(CMPL, completion(logit_bias={"5": 1, "05": 2}), JSON, 400,
                 id="logit-bias-token-twice"),
    pytest.param(CMPL, completion(logit_bias={"5": 500}), JSON, 400, id="logit-bias-huge"),
    pytest.param(CMPL, completion(logit_bias={"999999": 1}), JSON, 400,
                 id="logit-bias-token-out-of-vocab"),
    pytest.param(CMPL, completion(model="gpt-4"), JSON, 404, id="unknown-model"),
    pytest.param(CMPL, completion(response_format={"type": "xml"}), JSON, 400,
                 id="response-format-unknown-type"),
    pytest.param(CHAT, chat(response_format={"type": "json_schema"}), JSON, 400,
                 id="response-format-schema-missing"),
    pytest.param(CMPL, completion(structured_outputs={"regex": "a+", "choice": ["a"]}), JSON,
                 400, id="structured-outputs-two-kinds"),
    pytest.param(CMPL, completion(structured_outputs={"regex": "a+"},
                                  guided_choice=["a"]), JSON, 400,
                 id="structured-outputs-and-guided"),
    pytest.param(CMPL, completion(guided_regex=5), JSON, 400, id="guided-regex-int"),
    pytest.param(CMPL, completion(structured_outputs={"json": "[" * 5000}), JSON, 400,
                 id="structured-outputs-json-nested-too-deep"),
    pytest.param(CMPL, completion(structured_outputs={"regexp": "a+"}), JSON, 400,
                 id="structured-outputs-unknown-key"),
    pytest.param(CMPL, completion(structured_outputs={"regex": "(unclosed"}), JSON, 400,
                 id="structured-outputs-regex-does-not-compile"),
    pytest.param(CHAT, chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": 12}}}}}), JSON,
                 400, id="response-format-schema-does-not-compile"),
    pytest.param(CHAT, {"model": NAME}, JSON, 400, id="missing-messages"),
    pytest.param(CHAT, chat(messages=[]), JSON, 400, id="empty-messages"),
    pytest.param(CHAT, chat(messages="Hi"), JSON, 400, id="messages-string"),
    pytest.param(CHAT, chat(messages=[{"role": "wizard", "content": "Hi"}]), JSON, 400,
                 id="unknown-role"),
    pytest.param(CHAT, chat(messages=[{"role": "user"}]), JSON, 400, id="missing-content"),
    pytest.param(CHAT, chat(messages=[{"role": "user", "content": 5}]), JSON, 400,
                 id="content-int"),
    pytest.param(CHAT, chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]), JSON, 400,
                 id="content-image-part"),
    pytest.param(CHAT, chat(top_logprobs=3), JSON, 400, id="top-logprobs-without-logprobs"),
    pytest.param(CHAT, chat(logprobs=True, top_logprobs=21), JSON, 400, id="top-logprobs-huge"),
    pytest.param(CHAT, chat(max_completion_tokens=0), JSON, 400, id="max-completion-tokens-0"),
    # Tool calls. This server has no --tool-call-parser: "auto", the default, is refused.
    pytest.param(CHAT, chat(tools=TOOLS), JSON, 400, id="tools-auto-without-parser"),
    pytest.param(CHAT, chat(tool_choice="required"), JSON, 400, id="tool-choice-without-tools"),
    pytest.param(CHAT, chat(tools=TOOLS, tool_choice="always"), JSON, 400,
                 id="tool-choice-unknown-string"),
    pytest.param(CHAT, chat(tools=TOOLS, tool_choice={"type": "function",
                                                      "function": {"name": "g"}}), JSON, 400,
                 id="tool-choice-names-no-tool"),
    pytest.param(CHAT, chat(tools=TOOLS + TOOLS, tool_choice="required"), JSON, 400,
                 id="tools-same-name-twice"),
    pytest.param(CHAT, chat(tools=[{"type": "retrieval"}], tool_choice="required"), JSON, 400,
                 id="tool-type-unknown"),
    pytest.param(CHAT, chat(tools=TOOLS, tool_choice="required",
                            response_format={"type": "json_object"}), JSON, 400,
                 id="tool-choice-required-and-response-format"),
    pytest.param(CHAT, chat(messages=[{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{bad"}}]}]),
                 JSON, 400, id="tool-call-arguments-not-json"),
    pytest.param(CHAT, chat(messages=[{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]),
                 JSON, 400, id="tool-call-arguments-not-an-object"),
    pytest.param(CHAT, chat(messages=[{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f",
                                                      "arguments": "[" * 100_000}}]}]),
                 JSON, 400, id="tool-call-arguments-nested-too-deep"),
    pytest.param(CHAT, chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "$defs": None}}}], tool_choice="required"),
                 JSON, 400, id="tool-parameters-defs-not-an-object"),
    pytest.param(CHAT, chat(messages=[{"role": "user", "content": "x", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]),
                 JSON, 400, id="tool-calls-on-a-user-message"),
    pytest.param(CHAT, chat(model="nope"), JSON, 404, id="chat-unknown-model"),
    pytest.param(CHAT, chat(chat_template_kwargs={"documents": 5}), JSON, 400,
                 id="template-documents-not-a-list"),
    pytest.param(CHAT, chat(chat_template_kwargs={"documents": ["x"]}), JSON, 400,
                 id="template-documents-not-dicts"),
    pytest.param(CMPL, completion(repetition_penalty=0.0), JSON, 400,
                 id="repetition-penalty-zero"),
    # Bounded lists: each stop string is searched after every token, the bias applied at every
    # step, for every choice.
    pytest.param(CMPL, completion(stop=["x"] * 65), JSON, 400, id="too-many-stop-strings"),
    # A lone surrogate: no tokenizer takes it (a TypeError, a 500) and UTF-8 cannot echo it
    # (the response failed after the whole generation, or cut a stream at its first event).
    pytest.param(CMPL, completion(model="\ud800"), JSON, 400, id="model-a-lone-surrogate"),
    pytest.param(CMPL, completion(prompt="a\udc00b"), JSON, 400, id="prompt-a-lone-surrogate"),
    # Unescaped, as bytes UTF-8 forbids (json.loads reads them with surrogatepass).
    pytest.param(CMPL, json.dumps(completion(prompt="a@b")).encode().replace(b"@", b"\xed\xa0\x80"),
                 JSON, 400, id="prompt-a-raw-surrogate"),
    pytest.param(CHAT, chat(messages=[{"role": "user", "content": "\ud83d"}]), JSON, 400,
                 id="message-a-lone-surrogate"),
    pytest.param("/v1/responses", {"model": NAME, "input": "Hi", "metadata": {"k": "\ud800"}},
                 JSON, 400, id="responses-metadata-a-lone-surrogate"),
    pytest.param("/v1/responses", {"model": NAME, "input": "Hi", "stream": True,
                                   "user": "\udfff"}, JSON, 400,
                 id="responses-streamed-user-a-lone-surrogate"),
    pytest.param(CMPL, completion(logit_bias={"\ud800": "x"}), JSON, 400,
                 id="logit-bias-key-a-lone-surrogate"),
    pytest.param(CMPL, completion(stop="x" * 1025), JSON, 400, id="stop-string-too-long"),
    pytest.param(CMPL, completion(stop_token_ids=[5] * 4097), JSON, 400,
                 id="too-many-stop-token-ids"),
    pytest.param(CMPL, completion(logit_bias={str(i): 1.0 for i in range(4097)}), JSON, 400,
                 id="logit-bias-too-long"),
    pytest.param(CHAT, chat(stop_token_ids=[10**6], structured_outputs={"choice": ["a", "b"]}),
                 JSON, 400, id="stop-token-id-past-the-vocabulary"),
    # This server schedules first come, first served: a priority would be silently ignored.
    pytest.param(CMPL, completion(priority=1), JSON, 400, id="priority-without-the-policy"),
    pytest.param(CHAT, chat(priority=-3), JSON, 400, id="chat-priority-without-the-policy"),
    pytest.param(CHAT, chat(priority="high"), JSON, 400, id="priority-not-an-integer"),
    pytest.param(CHAT, chat(priority=True), JSON, 400, id="priority-a-boolean"),
    pytest.param("/v1/responses", {"model": NAME, "input": "Hi", "priority": 2}, JSON, 400,
                 id="responses-priority-without-the-policy"),
    # Served only with --allow-runtime-lora-updating.
    pytest.param("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/tmp"}, JSON, 404,
                 id="runtime-lora-loading-off"),
    pytest.param(CMPL, b'{"prompt": "Hello", ', JSON, 400, id="invalid-json"),
    pytest.param(CMPL, b"", JSON, 400, id="empty-body"),
    pytest.param(CMPL, [1, 2, 3], JSON, 400, id="body-not-an-object"),
    pytest.param(CMPL, b"prompt=Hello", "application/x-www-form-urlencoded", 415,
                 id="form-content-type"),
    pytest.param(CHAT, b'{"messages": []}', "text/plain", 415, id="text-content-type"),
]


def assert_openai_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert "param" in error and "code" in error
    return error


@pytest.mark.parametrize(("path", "body", "content_type", "status"), BAD_REQUESTS)
def test_malformed_request(server: LiveServer, path: str, body, content_type: str,
                           status: int):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = httpx.post(server.url + path, content=content, timeout=30,
                      headers={**AUTH, "Content-Type": content_type})
    assert_openai_error(resp, status)


def test_null_fields_read_as_not_set(server: LiveServer):
    """OpenAI's fields are nullable and some clients send null for "not set": served with the
    defaults, as OpenAI and vLLM serve them."""
    nulls = {"n": None, "stream": None, "temperature": None, "stop": None, "seed": None}
    reply = httpx.post(f"{server.url}{CMPL}", json=completion(echo=None, logprobs=None, **nulls),
                       headers=AUTH, timeout=60)
    assert reply.status_code == 200 and len(reply.json()["choices"]) == 1
    reply = httpx.post(f"{server.url}{CHAT}", json=chat(logprobs=None, top_logprobs=None,
                                                        **nulls), headers=AUTH, timeout=60)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
    streamed = httpx.post(f"{server.url}{CHAT}", json=chat(
        stream=True, stream_options={"include_usage": None}), headers=AUTH, timeout=60)
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert '"usage":{' not in streamed.text  # include_usage: null is false
    assert_openai_error(httpx.post(f"{server.url}{CHAT}", json=chat(messages=None),
                                   headers=AUTH, timeout=60), 400)  # required stays required


def test_an_emoji_sent_as_a_surrogate_pair_is_served(server: LiveServer):
    # json.dumps' ensure_ascii writes U+1F600 as the escaped pair \ud83d\ude00.
    body = json.dumps(chat(messages=[{"role": "user", "content": "Hi \U0001F600"}]))
    assert "\\ud83d\\ude00" in body
    reply = httpx.post(f"{server.url}{CHAT}", content=body.encode(), timeout=60,
                       headers={**AUTH, "Content-Type": JSON})
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]


def test_routing_errors_have_openai_shape(server: LiveServer):
    assert_openai_error(httpx.get(f"{server.url}/v1/completions", headers=AUTH), 405)
    assert_openai_error(httpx.get(f"{server.url}/v1/nothing-here", headers=AUTH), 404)


def test_serves_normally_after_bad_requests(server: LiveServer):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    resp = client.completions.create(model=NAME, prompt="The capital of France is",
                                     max_tokens=4, temperature=0)
    assert resp.choices[0].text and resp.usage.completion_tokens == 4
    assert kv_pool_is_free(server)


# ---- API key -----------------------------------------------------------------------------------
def test_api_key_enforced(server: LiveServer):
    url = f"{server.url}/v1/chat/completions"
    assert_openai_error(httpx.post(url, json=chat()), 401)
    assert_openai_error(httpx.post(url, json=chat(), headers={"Authorization": "Bearer no"}),
                        401)
    assert_openai_error(httpx.post(url, json=chat(), headers={"Authorization": KEY}), 401)
    # The key is checked before the body is even parsed.
    assert_openai_error(httpx.post(url, content=b"{oops", headers={"Content-Type": JSON}), 401)
    assert httpx.post(url, json=chat(), headers=AUTH).status_code == 200
    assert httpx.get(f"{server.url}/v1/models", headers=AUTH).json()["data"][0]["id"] == NAME
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()
    # The tokenizer endpoints are API too.
    for path, body in (("/tokenize", {"prompt": "Hi"}), ("/detokenize", {"tokens": [5]})):
        assert_openai_error(httpx.post(f"{server.url}{path}", json=body), 401)
        assert httpx.post(f"{server.url}{path}", json=body, headers=AUTH).status_code == 200
    # Probes and scrapers need no key.
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/metrics").status_code == 200


# ---- overload ----------------------------------------------------------------------------------
def test_burst_past_max_queue_gets_429s(server: LiveServer):
    async def one(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post("/v1/completions", json=completion(
            max_tokens=8, ignore_eos=True, temperature=0))

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=60) as client:
            return await asyncio.gather(*(one(client) for _ in range(16)))

    outcomes = server.metrics()
    responses = asyncio.run(burst())
    ok = [r for r in responses if r.status_code == 200]
    rejected = [r for r in responses if r.status_code != 200]
    assert len(ok) >= 4 and rejected, [r.status_code for r in responses]
    # A refused request is no abort; the admitted ones finished by length.
    after = server.metrics()
    for reason, moved in (("abort", 0), ("length", len(ok))):
        key = f"vllm:request_success_total{{finished_reason={reason}}}"
        assert after[key] - outcomes[key] == moved, reason
    for r in rejected:
        assert assert_openai_error(r, 429)["type"] == "rate_limit_error"
    assert all(r.json()["usage"]["completion_tokens"] == 8 for r in ok)
    assert wait_until(lambda: kv_pool_is_free(server))


def _successes(server: LiveServer) -> float:
    text = httpx.get(f"{server.url}/metrics", headers=AUTH).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def test_a_beam_search_too_wide_for_the_server_is_refused_before_it_runs(server: LiveServer):
    """3 prompts x 2 beams need 6 sequences, past this server's 4 (2 running + 2 waiting): a
    400 before any step, not after the first (which runs one beam a prompt)."""
    before = _successes(server)
    resp = httpx.post(f"{server.url}{CMPL}", headers=AUTH, json=completion(
        prompt=["a", "b", "c"], n=2, use_beam_search=True))
    assert resp.status_code == 400, resp.text
    assert "6 sequences" in resp.json()["error"]["message"]
    assert _successes(server) == before


# ---- shutdown (last: it stops this module's server) ------------------------------------------
def test_sigterm_drains_then_exits_zero(server: LiveServer):
    """Open responses finish: a stream, and a beam search, whose every step is an engine
    request of its own (they were refused as new requests once the drain began)."""
    body = completion(max_tokens=16, ignore_eos=True, temperature=0, stream=True)
    beam_body = completion(max_tokens=24, ignore_eos=True, n=2, use_beam_search=True)
    events: list[str] = []
    with ThreadPoolExecutor(1) as pool:
        before = _successes(server)
        beam = pool.submit(httpx.post, f"{server.url}{CMPL}", headers=AUTH, json=beam_body,
                           timeout=60)
        assert wait_until(lambda: _successes(server) > before)  # its first step has run
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers=AUTH,
                          timeout=30) as resp:
            for line in resp.iter_lines():
                if not line:
                    continue
                events.append(line.removeprefix("data: "))
                if len(events) == 1:
                    assert not beam.done()
                    server.proc.send_signal(signal.SIGTERM)
                    t0 = time.monotonic()
        beam_resp = beam.result()
    # The responses in flight were allowed to finish...
    assert events[-1] == "[DONE]"
    assert [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]][-1] == "length"
    assert beam_resp.status_code == 200, beam_resp.text
    assert [c["finish_reason"] for c in beam_resp.json()["choices"]] == ["length", "length"]
    # ...then the process stopped cleanly and promptly.
    assert server.proc.wait(timeout=15) == 0, server.output()
    assert time.monotonic() - t0 < 15


def _ends_with_an_error_event(events: list[str]) -> None:
    """A stream the server aborted: an in-band error in OpenAI's shape, then [DONE]."""
    assert events[-1] == "[DONE]", events[-3:]
    error = json.loads(events[-2])["error"]
    assert "shutting down" in error["message"] and error["type"] == "service_unavailable_error"


def test_a_second_ctrl_c_stops_waiting_for_open_responses():
    """The first SIGINT lets open responses finish (up to --shutdown-timeout, a minute here);
    a second one aborts them and exits at once, as uvicorn does on its own. The aborted stream
    still ends properly."""
    live = LiveServer(*MODEL_FLAGS, "--shutdown-timeout", "60")
    try:
        body = {"model": MODEL, "prompt": "Hello", "max_tokens": 1000, "ignore_eos": True,
                "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{live.url}/v1/completions", json=body, timeout=90) as resp:
            assert resp.status_code == 200, resp.read()
            lines = resp.iter_lines()
            next(line for line in lines if line)  # the stream has started
            live.proc.send_signal(signal.SIGINT)
            time.sleep(1.0)
            assert live.proc.poll() is None  # draining: the response is still open
            live.proc.send_signal(signal.SIGINT)
            events = [line.removeprefix("data: ") for line in lines if line]
            rc = live.exit_code(20, "a second SIGINT")
        assert rc == 0, live.output()
        _ends_with_an_error_event(events)
    finally:
        live.stop()


def test_responses_still_open_at_the_shutdown_timeout_end_with_an_error():
    """SIGTERM lets open responses run for --shutdown-timeout. Those still open then are
    aborted by the engine and end properly, before uvicorn would cancel them (a cut stream, a
    bare 500): a stream with an error event and [DONE], a non-streaming request with a 503 in
    OpenAI's shape."""
    live = LiveServer(*MODEL_FLAGS, "--shutdown-timeout", "3")
    try:
        body = {"model": MODEL, "prompt": "Hello", "max_tokens": 1000, "ignore_eos": True,
                "temperature": 0}
        with ThreadPoolExecutor(1) as pool:
            plain = pool.submit(httpx.post, f"{live.url}/v1/completions", json=body, timeout=60)
            with httpx.stream("POST", f"{live.url}/v1/completions",
                              json={**body, "stream": True}, timeout=60) as resp:
                lines = resp.iter_lines()
                next(line for line in lines if line)  # the stream has started
                assert wait_until(lambda: live.stats()["num_running"] == 2)
                live.proc.send_signal(signal.SIGTERM)
                t0 = time.monotonic()
                events = [line.removeprefix("data: ") for line in lines if line]
            assert_openai_error(plain.result(), 503)
        assert time.monotonic() - t0 > 2  # the timeout was waited out first
        _ends_with_an_error_event(events)
        assert live.exit_code(20, "SIGTERM") == 0, live.output()
    finally:
        live.stop()


def test_a_bug_of_ours_is_a_500_not_a_400(llm, monkeypatch):
    """Only reading the request may answer a ValueError with a 400. One raised while answering
    is our bug (logprobs cut short by a stop inside accepted drafts once came back as a 400
    "zip() argument 2 is longer than argument 1"): a 500, in OpenAI's shape. In process, with
    the offline engine of the other tests."""
    from fastapi.testclient import TestClient

    from specserve.server.api_server import build_app
    from specserve.server.serving import OpenAIServing

    def broken(*_args, **_kwargs):
        raise ValueError("zip() argument 2 is longer than argument 1")

    monkeypatch.setattr(OpenAIServing, "_completion_logprobs", broken)
    app = build_app(llm.engine, served_model_name=NAME)
    with TestClient(app, raise_server_exceptions=False) as http:
        body = completion(max_tokens=2, logprobs=1)
        assert assert_openai_error(http.post("/v1/completions", json=body), 500)["type"] \
            == "server_error"
        refused = completion(max_tokens=2, min_tokens=3)  # SamplingParams refuses it
        assert "min_tokens" in assert_openai_error(http.post("/v1/completions", json=refused),
                                                   400)["message"]
        assert http.post("/v1/completions", json=completion()).status_code == 200


def test_a_model_is_found_by_its_path_as_the_server_was_started_with_it(tmp_path):
    """vLLM serves a model under the path it was started with; ours under the path's last part.
    Both names find it (a client written for vLLM sends the path)."""
    from fastapi.testclient import TestClient
    from tiny_models import make_tiny_model

    from specserve import LLM
    from specserve.server.api_server import build_app

    path = str(make_tiny_model(tmp_path / "tiny-llama"))
    app = build_app(LLM(path, dtype="float32", kv_cache_memory=8 << 20).engine)
    with TestClient(app, raise_server_exceptions=False) as http:
        assert http.get("/v1/models").json()["data"][0]["id"] == "tiny-llama"
        for name in ("tiny-llama", path):
            body = {"model": name, "prompt": [5, 9], "max_tokens": 2}
            assert http.post("/v1/completions", json=body).status_code == 200, name
        assert_openai_error(http.post("/v1/completions", json={"model": "other", "prompt": "x"}),
                            404)


def test_a_browser_may_call_the_server_from_the_allowed_origins(llm):
    """--allowed-origins answers a browser's preflight (before the API key, which a preflight
    never carries) and marks the responses; without it there are no CORS headers and the
    preflight is a 405, as before."""
    from fastapi.testclient import TestClient

    from specserve.server.api_server import build_app

    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    app = build_app(llm.engine, served_model_name=NAME, api_key="k",
                    allowed_origins=["https://app.example"])
    with TestClient(app) as http:
        r = http.options("/v1/completions", headers=preflight)
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        r = http.get("/v1/models", headers={"Origin": "https://app.example",
                                            "Authorization": "Bearer k"})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        other = http.options("/v1/completions", headers={**preflight, "Origin": "https://evil"})
        assert "access-control-allow-origin" not in other.headers
    with TestClient(build_app(llm.engine, served_model_name=NAME)) as http:
        r = http.options("/v1/completions", headers=preflight)
        assert r.status_code == 405 and "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize("flag", [("--max-queue", "-1"), ("--shutdown-timeout", "-5"),
                                  ("--shutdown-timeout", "nan"), ("--stream-interval", "0"),
                                  ("--allowed-origins", ","), ("--tool-call-parser", "nope")])
def test_serve_refuses_out_of_range_flags(flag, capsys):
    import argparse

    from specserve.server.cli import add_serve_args

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(list(flag))
    assert flag[0] in capsys.readouterr().err
    args = parser.parse_args(["--max-queue", "0", "--shutdown-timeout", "0"])
    assert (args.max_queue, args.shutdown_timeout) == (0, 0.0)


def test_serve_refuses_auto_tool_choice_without_a_parser(caplog):
    import argparse

    from specserve.server.cli import add_serve_args, check_serve_flags

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    with pytest.raises(SystemExit, match="--tool-call-parser"):
        check_serve_flags(parser.parse_args(["--enable-auto-tool-choice"]))
    check_serve_flags(parser.parse_args(["--enable-auto-tool-choice", "--tool-call-parser",
                                        "hermes"]))
    check_serve_flags(parser.parse_args(["--tool-call-parser", "hermes"]))  # as vLLM: starts
    assert "read only with --enable-auto-tool-choice" in caplog.text


def test_a_server_whose_engine_failed_exits_with_the_cause():
    """An exception inside an engine step fails every request (503), and `serve` then exits 1
    saying the engine failed, rather than answering 503 for ~45 s and blaming the HTTP server.
    The step is broken on purpose in the subprocess."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import sys\n"
            "from specserve.engine.llm_engine import LLMEngine\n"
            "def broken(self, *a, **k):\n"
            "    raise RuntimeError('a step that fails on purpose')\n"
            "LLMEngine.step = broken\n"
            "from specserve.server.api_server import main\n"
            "main(sys.argv[1:])\n")
    proc = subprocess.Popen([sys.executable, "-c", code, "--port", str(port), "--log-level",
                             "warning", "--served-model-name", NAME, *MODEL_FLAGS],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_until(lambda: _healthy(url), timeout=180), "the server did not start"
        reply = httpx.post(f"{url}/v1/completions", json=completion(), timeout=60)
        assert assert_openai_error(reply, 503)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert "the engine failed" in out and "a step that fails on purpose" in out


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_a_body_over_the_limit_is_a_413_before_it_is_parsed():
    """--max-request-bytes: a larger body gets an OpenAI-shaped 413, declared (Content-Length)
    or streamed in chunks, and a body within the limit is served."""
    from fastapi import FastAPI
    from starlette.testclient import TestClient

    from specserve.server.api_server import BodyLimitMiddleware
    from specserve.server.errors import install_error_handlers

    app = FastAPI()
    install_error_handlers(app)

    @app.post("/v1/echo")
    async def echo(body: dict) -> dict:
        return body

    app.add_middleware(BodyLimitMiddleware, max_bytes=1000)
    client = TestClient(app, headers={"Content-Type": JSON})
    small = json.dumps({"x": "a" * 10}).encode()
    large = json.dumps({"x": "a" * 2000}).encode()
    assert client.post("/v1/echo", content=small).json() == {"x": "a" * 10}
    assert_openai_error(client.post("/v1/echo", content=large), 413)
    chunks = (large[i:i + 300] for i in range(0, len(large), 300))  # no Content-Length
    assert_openai_error(client.post("/v1/echo", content=chunks), 413)
