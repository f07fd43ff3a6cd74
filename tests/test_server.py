"""The OpenAI-compatible server, live: a real `python -m specserve.server.api_server` process on a
free local port, driven by the official openai client and by raw httpx, and checked against the
offline engine (greedy, fp32: the texts must be identical)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from specserve import SamplingParams, StructuredOutputsParams
from specserve.engine.detokenizer import token_bytes

MODEL = "SmolLM2-135M-Instruct"
# fp32 so that greedy text matches the offline engine token for token; a small KV pool is quick
# to allocate and still holds 64 short requests at once. One torch thread: on a small shared
# machine two OpenMP threads that wait for each other at every op run up to 30x slower.
MODEL_FLAGS = ("--dtype", "float32", "--kv-cache-memory", "160MiB", "--num-threads", "1")


def parse_metrics(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text page as {"name{label=value,...}": value}, model_name
    left out."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())
                              if k != "model_name")
            samples[f"{s.name}{{{labels}}}"] = s.value
    return samples


class LiveServer:
    """A server subprocess; `url` is its base URL. Used by test_server_errors.py too."""

    def __init__(self, *flags: str, startup_timeout: float = 180.0):
        with socket.socket() as s:  # a free port (the tiny race with other binders is harmless)
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="specserve-server-", suffix=".log")
        cmd = [sys.executable, "-m", "specserve.server.api_server", "--port", str(self.port),
               "--log-level", "warning", *flags]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + startup_timeout
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"server did not start in {startup_timeout}s:\n{self.output()}")
            time.sleep(0.25)

    def output(self) -> str:
        with open(self.log.name, errors="replace") as f:
            return f.read()[-4000:]

    def client(self) -> openai.OpenAI:
        """The official client on this server (no retries: a failure is the test's)."""
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0,
                             timeout=120)

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/stats", timeout=10).json()

    def metrics(self) -> dict[str, float]:
        return parse_metrics(httpx.get(f"{self.url}/metrics", timeout=10).text)

    def exit_code(self, timeout: float, after: str) -> int:
        """The server's exit code, waiting up to timeout seconds; a server still up then fails
        the test with its log (`after`: what it was sent)."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still serving {timeout:.0f} s after {after}:\n{self.output()}")

    def stop(self) -> None:
        """SIGTERM, as a process manager stops a server. One still up 15 s later is killed and
        fails the test: a server that ignores SIGTERM is a bug, not something to clean up."""
        ignored = False
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                ignored = True
                self.proc.kill()
                self.proc.wait()
        output = self.output() if ignored else ""
        self.log.close()
        if ignored:
            pytest.fail(f"the server was still up 15 s after SIGTERM:\n{output}")


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def kv_pool_is_free(server: LiveServer) -> bool:
    s = server.stats()
    return s["kv_blocks_free"] == s["kv_blocks_total"] and s["num_requests_in_flight"] == 0


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    live = LiveServer(*MODEL_FLAGS)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return server.client()


_offline_cache: dict[str, tuple[str, int, str]] = {}


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """The in-process engine on one torch thread, as the server runs (see MODEL_FLAGS), for
    the same greedy tokens."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def offline_text(llm, prompt: str | list[dict], **kw) -> tuple[str, int, str]:
    """(text, number of tokens, finish reason) from the in-process engine; memoised, since
    several tests compare against the same generation."""
    key = json.dumps([prompt, kw], sort_keys=True, default=repr)
    if key not in _offline_cache:
        params = SamplingParams(temperature=0, **kw)
        with one_thread():
            out = (llm.chat(prompt, params) if isinstance(prompt, list)
                   else llm.generate(prompt, params))[0].outputs[0]
        _offline_cache[key] = out.text, len(out.token_ids), out.finish_reason
    return _offline_cache[key]


PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]
CHAT = [{"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three primary colors."}]


# ---- the official client, sync / async / streaming, equals the offline engine -----------------
def test_version(server: LiveServer):
    from importlib.metadata import version

    assert httpx.get(f"{server.url}/version", timeout=10).json() == {
        "version": version("specserve")}


def test_models_and_health(server: LiveServer, client: openai.OpenAI):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{server.url}/health").status_code == 200


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_matches_offline(client: openai.OpenAI, llm, prompt: str):
    text, num_tokens, finish = offline_text(llm, prompt, max_tokens=16)
    resp = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
    assert resp.choices[0].text == text
    assert resp.choices[0].finish_reason == finish
    assert resp.usage.completion_tokens == num_tokens
    assert resp.usage.prompt_tokens == len(llm.engine.tokenize(prompt))


def test_beam_search_matches_offline(client: openai.OpenAI, llm, server: LiveServer):
    """vLLM's use_beam_search: n beams as n choices, best first, the offline beam search's
    texts, on completions (two prompts) and chat. Its parameters are observed once per prompt,
    not once per beam and step."""
    from specserve import BeamSearchParams

    prompts = ["The capital of France is", "def fibonacci(n):"]
    want = llm.beam_search(prompts, BeamSearchParams(beam_width=3, max_tokens=8))
    n_count, n_sum = "vllm:request_params_n_count{}", "vllm:request_params_n_sum{}"
    before = server.metrics()
    resp = client.completions.create(model=MODEL, prompt=prompts, max_tokens=8, n=3, best_of=3,
                                     extra_body={"use_beam_search": True})
    after = server.metrics()
    assert (after[n_count] - before[n_count], after[n_sum] - before[n_sum]) == (2, 6)
    assert [c.text for c in resp.choices] == [s.text for o in want for s in o.sequences]
    assert [c.finish_reason for c in resp.choices] == [
        s.finish_reason for o in want for s in o.sequences]
    assert resp.usage.completion_tokens == sum(len(s.output_token_ids) for o in want
                                               for s in o.sequences)
    from specserve.engine.prompts import encode_prompt, render_chat

    tokenizer = llm.get_tokenizer()
    chat_ids = encode_prompt(tokenizer, render_chat(tokenizer, CHAT), add_special_tokens=False)
    want = llm.beam_search([chat_ids], BeamSearchParams(beam_width=2, max_tokens=10,
                                                        length_penalty=0.5))[0]
    resp = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, n=2,
                                          top_p=1.0, presence_penalty=0, seed=3,  # no effect
                                          extra_body={"use_beam_search": True,
                                                      "length_penalty": 0.5, "stop": []})
    assert [c.message.content for c in resp.choices] == [s.text for s in want.sequences]


def test_chat_matches_offline(client: openai.OpenAI, llm):
    text, num_tokens, finish = offline_text(llm, CHAT, max_tokens=20)
    resp = client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=20,
                                          temperature=0)
    assert resp.choices[0].message.content == text
    assert resp.choices[0].finish_reason == finish
    assert resp.usage.completion_tokens == num_tokens


def test_async_chat_matches_offline(server: LiveServer, llm):
    text, num_tokens, finish = offline_text(llm, CHAT, max_tokens=20)
    # Content as a list of text parts is the same message as a plain string.
    messages = [CHAT[0], {"role": "user", "content": [{"type": "text",
                                                       "text": CHAT[1]["content"]}]}]

    async def run():
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused",
                                     max_retries=0)
        async with aclient:
            return await aclient.chat.completions.create(model=MODEL, messages=messages,
                                                         max_tokens=20, temperature=0)

    resp = asyncio.run(run())
    assert resp.choices[0].message.content == text
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].finish_reason == finish
    assert resp.usage.completion_tokens == num_tokens


def test_streaming_matches_offline(client: openai.OpenAI, llm):
    text, num_tokens, finish = offline_text(llm, PROMPTS[0], max_tokens=16)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=16,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == finish
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == num_tokens

    text, num_tokens, finish = offline_text(llm, CHAT, max_tokens=20)
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=20,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == finish
    assert chunks[-1].usage.completion_tokens == num_tokens


def test_async_streaming_chat(server: LiveServer, llm):
    text, _, _ = offline_text(llm, CHAT, max_tokens=20)

    async def run() -> str:
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused",
                                     max_retries=0)
        async with aclient:
            stream = await aclient.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=20, temperature=0, stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in stream])

    assert asyncio.run(run()) == text


def test_usage_counts_the_prompt_tokens_read_from_the_prefix_cache(client: openai.OpenAI):
    """OpenAI's prompt_tokens_details.cached_tokens: a prompt's full blocks found in the prefix
    cache, counted once per prompt (its n choices share one prefill)."""
    prompt = "A prompt that no other test sends, long enough for blocks of sixteen: " * 3
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, n=2)
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, n=2)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % 16 == 0 and cached <= again.usage.prompt_tokens
    chat = [{"role": "user", "content": prompt}]
    client.chat.completions.create(model=MODEL, messages=chat, max_tokens=2)
    stream = client.chat.completions.create(model=MODEL, messages=chat, max_tokens=2, n=3,
                                            stream=True, stream_options={"include_usage": True})
    usage = [c.usage for c in stream if c.usage is not None][-1]
    assert 0 < usage.prompt_tokens_details.cached_tokens <= usage.prompt_tokens
    # vLLM's cache_salt: a tenant's requests hit only their own salt's cached prefix.

    def cached(salt: str) -> int:
        return client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=1, extra_body={"cache_salt": salt},
        ).usage.prompt_tokens_details.cached_tokens
    assert cached("tenant-a") == 0  # the unsalted copy is not served
    assert cached("tenant-a") == again.usage.prompt_tokens_details.cached_tokens  # its own is
    assert cached("tenant-b") == 0


# ---- sampling features -----------------------------------------------------------------------
def test_stop_strings_streamed_and_not(client: openai.OpenAI, llm):
    prompt = "1, 2, 3, 4,"
    full, _, _ = offline_text(llm, prompt, max_tokens=24, ignore_eos=True)
    stop = full[len(full) // 2:][:3]  # a stop string that occurs in the greedy continuation
    expected = full[:full.index(stop)]  # the text ends where the stop string first begins
    kw = dict(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=[stop],
              extra_body={"ignore_eos": True})
    resp = client.completions.create(**kw)
    assert resp.choices[0].text == expected
    assert resp.choices[0].finish_reason == "stop"
    # Streaming holds back text that could be the start of the stop string.
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw))
    assert streamed == expected
    # vLLM's stop_reason names the string, in every shape (a streamed chat's last chunk too).
    assert resp.choices[0].stop_reason == stop
    chat = dict(model=MODEL, messages=CHAT, max_tokens=24, temperature=0,
                extra_body={"ignore_eos": True})
    reply = client.chat.completions.create(**chat).choices[0].message.content
    chat["stop"] = [reply[len(reply) // 2:][:3]]
    whole = client.chat.completions.create(**chat).choices[0]
    last = list(client.chat.completions.create(stream=True, **chat))[-1].choices[0]
    assert whole.finish_reason == last.finish_reason == "stop"
    assert whole.stop_reason == last.stop_reason == chat["stop"][0]


def test_n_seed_and_logprobs(client: openai.OpenAI):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=7,
              n=3, logprobs=2)
    first = client.completions.create(**kw)
    again = client.completions.create(**kw)
    assert sorted(c.index for c in first.choices) == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]  # seeded
    assert len({c.text for c in first.choices}) > 1  # each choice gets its own seed
    assert first.usage.completion_tokens == 24
    lp = first.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    assert all(2 <= len(top) <= 3 and v <= 0 for top, v in zip(lp.top_logprobs,
                                                              lp.token_logprobs, strict=True))

    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5,
                                          temperature=0, logprobs=True, top_logprobs=3,
                                          extra_body={"speculation": 0})
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob >= t.logprob - 1e-6
               for t in content)


def test_min_p_one_samples_the_greedy_text(client: openai.OpenAI, llm):
    """vLLM's min_p field: at 1 only the likeliest token may be drawn, so a hot temperature
    still gives the greedy text."""
    want = offline_text(llm, PROMPTS[0], max_tokens=12, ignore_eos=True)[0]
    for _ in range(2):
        got = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=12,
                                        temperature=1.8, extra_body={"min_p": 1.0,
                                                                     "ignore_eos": True})
        assert got.choices[0].text == want
    hot = {client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=12,
                                     temperature=1.8, seed=s).choices[0].text for s in range(3)}
    assert hot != {want}  # without it, that temperature strays


def test_penalties_and_logit_bias(client: openai.OpenAI, llm):
    kw = dict(max_tokens=12, presence_penalty=0.5, frequency_penalty=0.5,
              extra_body={"repetition_penalty": 1.2, "ignore_eos": True})
    text, _, _ = offline_text(llm, PROMPTS[1], max_tokens=12, presence_penalty=0.5,
                              frequency_penalty=0.5, repetition_penalty=1.2, ignore_eos=True)
    resp = client.completions.create(model=MODEL, prompt=PROMPTS[1], temperature=0, **kw)
    assert resp.choices[0].text == text
    forced = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=3,
                                       temperature=0, logit_bias={"42": 100})
    assert forced.choices[0].text == llm.get_tokenizer().decode([42] * 3)


def test_bad_words_and_allowed_token_ids(client: openai.OpenAI, llm):
    free, _, _ = offline_text(llm, PROMPTS[0], max_tokens=8)
    word = free.split()[0]  # the word the model wants most: banned, it writes another
    text, _, _ = offline_text(llm, PROMPTS[0], max_tokens=8, bad_words=[word])
    resp = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8,
                                     temperature=0, extra_body={"bad_words": [word]})
    assert resp.choices[0].text == text and word not in text.split()
    allowed = llm.get_tokenizer()(" Paris Lyon and", add_special_tokens=False).input_ids
    resp = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=6, logprobs=0,
                                     temperature=1.0, seed=5,
                                     extra_body={"allowed_token_ids": allowed,
                                                 "return_tokens_as_token_ids": True})
    tokens = [int(t.removeprefix("token_id:")) for t in resp.choices[0].logprobs.tokens]
    assert len(tokens) == 6 and set(tokens) <= set(allowed)


# ---- structured outputs ------------------------------------------------------------------------
# The free reply to the prompt below copies its JSON; the schema asks for other keys.
CITY = {"type": "object", "additionalProperties": False,
        "properties": {"city": {"type": "string", "maxLength": 24},
                       "country": {"enum": ["France", "Spain"]}},
        "required": ["city", "country"]}


def test_response_format_json_schema_and_json_object(server: LiveServer, client: openai.OpenAI,
                                                      llm):
    jump_forward = "specserve:jump_forward_draft_tokens_total{}"
    drafted_before = server.metrics()[jump_forward]
    messages = [{"role": "user", "content": 'Copy this JSON exactly: {"city": "Paris", '
                                            '"population": 2100000}'}]
    text, _, _ = offline_text(llm, messages, max_tokens=48,
                              structured_outputs=StructuredOutputsParams(json=CITY))
    resp = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=48, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "city", "schema": CITY, "strict": True}})
    assert resp.choices[0].message.content == text
    assert set(json.loads(text)) == {"city", "country"}
    # The schema's keys are forced: they were drafted (and the text is still the engine's).
    assert server.metrics()[jump_forward] > drafted_before
    # json_object, streamed: the deltas add up to one JSON object.
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=48, temperature=0, stream=True,
        response_format={"type": "json_object"})
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert isinstance(json.loads(streamed), dict)


@pytest.mark.parametrize("field", ["structured_outputs", "guided_choice"])
def test_structured_outputs_body_field_on_completions(client: openai.OpenAI, field: str):
    choices = ["yes", "no"]
    body = {"structured_outputs": {"choice": choices}} if field == "structured_outputs" \
        else {"guided_choice": choices}  # vLLM's older name
    resp = client.completions.create(model=MODEL, prompt="Is the sky green? Answer:",
                                     max_tokens=8, temperature=1.0, seed=3, n=4,
                                     extra_body=body)
    assert all(c.text in choices and c.finish_reason == "stop" for c in resp.choices)


# ---- many clients, a third of which hang up --------------------------------------------------
def test_64_concurrent_streams_with_disconnects(server: LiveServer):
    finished_before = server.metrics().get("vllm:request_success_total{finished_reason=length}",
                                           0)
    max_tokens = 24

    async def one(client: httpx.AsyncClient, i: int) -> bool:
        """True if the stream completed; False if this client hung up on purpose."""
        body = {"model": MODEL, "prompt": f"Story {i}: once upon a time in village {i},",
                "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        events: list[str] = []
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if line:
                    assert line.startswith("data: ")
                    events.append(line.removeprefix("data: "))
                if i % 3 == 0 and len(events) == 3:
                    return False  # leaving the block drops the connection mid-stream
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"]["completion_tokens"] == max_tokens
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        return True

    async def run() -> list[bool]:
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=120) as client:
            return await asyncio.gather(*(one(client, i) for i in range(64)))

    completed = asyncio.run(run())
    assert sum(completed) == 64 - len(range(0, 64, 3))
    # Aborts are asynchronous: give the engine thread a moment to free the blocks.
    assert wait_until(lambda: kv_pool_is_free(server)), server.stats()
    # The clients that hung up were aborted, not run to their end for nobody.
    finished = server.metrics()["vllm:request_success_total{finished_reason=length}"]
    assert finished - finished_before == sum(completed)


def test_non_streaming_disconnect_aborts(server: LiveServer):
    """The engine request is aborted, and counted as vLLM's finished_reason="abort"."""
    aborted = 'vllm:request_success_total{finished_reason=abort}'
    before = server.metrics()[aborted]
    body = {"model": MODEL, "prompt": "Tell me a long story.", "max_tokens": 2000,
            "ignore_eos": True, "n": 2}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=1.0)
    assert wait_until(lambda: kv_pool_is_free(server)), server.stats()
    assert server.metrics()[aborted] == before + 2


def test_logprob_bytes_and_offsets_of_tokens_that_split_a_character(client: openai.OpenAI,
                                                                     llm):
    """Byte-level BPE splits an emoji over tokens that each decode to U+FFFD alone. Chat
    logprobs carry each token's raw bytes, which together rebuild the reply; a completion's
    text_offset counts characters, a token holding part of one adding nothing until it
    completes (they used to be the bytes of U+FFFD, and offsets past the end of the text)."""
    prompt = "Emoji list: \U0001F600 \U0001F603 \U0001F604 \U0001F389 "
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=12,
        temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    pieces = [bytes(t.bytes) for t in content]
    assert any(p.decode(errors="replace") != p.decode(errors="ignore") for p in pieces), \
        "no token's bytes end inside a character: wrong bytes, or nothing to test"
    special = {"<|im_end|>", "<|endoftext|>"}
    text = b"".join(p for p, t in zip(pieces, content, strict=True) if t.token not in special)
    # (12 tokens may end inside a character, which the reply's text shows as U+FFFD)
    assert text.decode(errors="ignore") == chat.choices[0].message.content.replace("\ufffd", "")
    for t in content:
        assert all(isinstance(top.bytes, list) for top in t.top_logprobs)

    done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                     logprobs=0, extra_body={"ignore_eos": True})
    choice = done.choices[0]
    ids = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12,
                                                ignore_eos=True))[0].outputs[0].token_ids
    raw = [token_bytes(llm.get_tokenizer(), t) for t in ids]
    assert any(r.decode(errors="replace") != r.decode(errors="ignore") for r in raw)
    want = [len(b"".join(raw[:i]).decode(errors="ignore")) for i in range(len(raw))]
    assert choice.logprobs.text_offset == want
    assert max(choice.logprobs.text_offset) < len(choice.text)
    # A special token that is not one of the tokenizer's named ones (<repo_name>, id 3) is left
    # out of the text too, and takes no room in the offsets.
    forced = client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, temperature=0,
                                       logprobs=0, logit_bias={"3": 100},
                                       extra_body={"ignore_eos": True})
    assert forced.choices[0].text == ""
    assert forced.choices[0].logprobs.text_offset == [0, 0, 0]


# ---- metrics -----------------------------------------------------------------------------------
def test_metrics_parse_and_move(server: LiveServer, client: openai.OpenAI):
    before = server.metrics()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total"):
        assert f"{name}{{}}" in before, name
    done = client.completions.create(model=MODEL, prompt="Metrics are", max_tokens=5,
                                     temperature=0)
    after = server.metrics()
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:prefix_cache_queries_total", "vllm:time_to_first_token_seconds_count",
                 "vllm:inter_token_latency_seconds_count",
                 "vllm:e2e_request_latency_seconds_count", "vllm:request_prompt_tokens_count",
                 "vllm:request_queue_time_seconds_count", "vllm:request_decode_time_seconds_count"):
        assert after[f"{name}{{}}"] > before.get(f"{name}{{}}", 0), name
    assert after["vllm:generation_tokens_total{}"] - before["vllm:generation_tokens_total{}"] == 5
    # The whole prompt, prefix-cache hits included, as vLLM counts it.
    assert (after["vllm:prompt_tokens_total{}"] - before["vllm:prompt_tokens_total{}"]
            == done.usage.prompt_tokens)
    assert not [name for name in after if name.endswith("_created{}")]


# ---- chat rendering, stream usage and refusals (OpenAI's and vLLM's extras) -----------------
def test_developer_role_is_rendered_as_system(client: openai.OpenAI):
    """OpenAI's developer role is the system role under its new name: SmolLM2's ChatML template
    predates it, so the prompt must be the system one, token for token (it was a 400)."""
    replies = {}
    for role in ("system", "developer"):
        messages = [{"role": role, "content": CHAT[0]["content"]}, CHAT[1]]
        replies[role] = client.chat.completions.create(model=MODEL, messages=messages,
                                                       max_tokens=12, temperature=0)
    system, developer = replies["system"], replies["developer"]
    assert developer.usage.prompt_tokens == system.usage.prompt_tokens
    assert developer.choices[0].message.content == system.choices[0].message.content


def test_continue_final_message_and_generation_prompt(server: LiveServer, llm):
    """vLLM's continue_final_message leaves the assistant's last message open, and the reply
    continues it; add_generation_prompt false renders no assistant header. Both used to be
    ignored (a new assistant turn was opened)."""
    tokenizer = llm.engine.tokenizer
    messages = [{"role": "user", "content": "Count to five"},
                {"role": "assistant", "content": "1, 2,"}]
    prefill = tokenizer.apply_chat_template(messages, tokenize=False,
                                            continue_final_message=True)
    num_prompt_tokens = len(tokenizer.apply_chat_template(
        messages, continue_final_message=True, return_dict=False))
    resp = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "messages": messages, "continue_final_message": True, "add_generation_prompt": False,
        "max_tokens": 5, "temperature": 0})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["usage"]["prompt_tokens"] == num_prompt_tokens
    assert prefill.endswith("1, 2,")
    # The reply is the greedy continuation of the open message, as the raw prompt gives it.
    reply = body["choices"][0]["message"]["content"]
    assert reply == offline_text(llm, prefill, max_tokens=5)[0]
    assert reply.lstrip().startswith("3"), reply  # "1, 2," goes on, not a new answer

    closed = tokenizer.apply_chat_template(messages[:1], tokenize=False)  # no header
    resp = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "messages": messages[:1], "add_generation_prompt": False, "max_tokens": 1})
    assert resp.json()["usage"]["prompt_tokens"] == len(llm.engine.tokenize(closed))
    # As in vLLM, chat_template_kwargs may set the two (they override the request's fields)...
    resp = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "messages": messages, "max_tokens": 1, "chat_template_kwargs": {
            "continue_final_message": True, "add_generation_prompt": False}})
    assert resp.json()["usage"]["prompt_tokens"] == num_prompt_tokens, resp.text
    # ...but not the renderer's own arguments, and the two may not contradict each other.
    for extra in ({"continue_final_message": True},  # add_generation_prompt defaults to true
                  {"chat_template_kwargs": {"tokenize": True}},
                  {"chat_template_kwargs": {"conversations": []}}):
        resp = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                          json={"messages": messages, "max_tokens": 1, **extra})
        assert resp.status_code == 400, (extra, resp.text)


def test_chat_echo_repeats_the_message_it_continues(client: openai.OpenAI, llm):
    """vLLM's echo: the content starts with the last message's when that is the assistant's
    (continued here), streamed in a chunk of its own; otherwise nothing is repeated."""
    messages = [*CHAT, {"role": "assistant", "content": "The three primary colors are"}]
    with one_thread():
        text = llm.chat(messages, SamplingParams(temperature=0, max_tokens=8),
                        add_generation_prompt=False,
                        continue_final_message=True)[0].outputs[0].text
    extra = {"echo": True, "add_generation_prompt": False, "continue_final_message": True}
    resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                          temperature=0, extra_body=extra)
    assert resp.choices[0].message.content == messages[-1]["content"] + text
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                                 temperature=0, stream=True, extra_body=extra))
    contents = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    assert contents[0] == messages[-1]["content"] and "".join(contents[1:]) == text
    plain = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4,
                                           temperature=0, extra_body={"echo": True})
    assert plain.choices[0].message.content == offline_text(llm, CHAT, max_tokens=4)[0]


def _sse_chunks(server: LiveServer, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=60) as resp:
        assert resp.status_code == 200, resp.read()
        lines = [line.removeprefix("data: ") for line in resp.iter_lines()
                 if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"prompt": PROMPTS[0], "n": 2, "logprobs": 1}),
    ("/v1/completions", {"prompt": PROMPTS[0]}),  # the text-only chunk template
    ("/v1/completions", {"prompt": PROMPTS[0], "n": 2, "echo": True, "logprobs": 1}),
    ("/v1/chat/completions", {"messages": CHAT}),
])
def test_continuous_usage_stats(server: LiveServer, path: str, body: dict):
    """vLLM's stream_options.continuous_usage_stats: every chunk carries the usage so far (all
    choices together), never decreasing, and the last chunk's is the final usage."""
    chunks = _sse_chunks(server, path, {**body, "max_tokens": 8, "temperature": 0,
                                        "ignore_eos": True, "stream": True, "stream_options": {
                                            "include_usage": True,
                                            "continuous_usage_stats": True}})
    usages = [c["usage"] for c in chunks]
    assert all(u is not None for u in usages), chunks
    final = usages[-1]
    assert chunks[-1]["choices"] == []  # include_usage's own last chunk
    assert final["completion_tokens"] == 8 * body.get("n", 1)
    for before, after in zip(usages[:-1], usages[1:], strict=True):
        assert after["prompt_tokens"] == final["prompt_tokens"]
        assert before["completion_tokens"] <= after["completion_tokens"]
    assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in usages)
    # The chunk that finished the last choice; the final usage adds what the prefix cache
    # served.
    assert usages[-2] == {k: v for k, v in final.items() if k != "prompt_tokens_details"}
    assert final["prompt_tokens_details"]["cached_tokens"] >= 0
    # Without it, or without include_usage (vLLM's rule), the chunks carry no usage (the hot
    # path is unchanged).
    for options in (None, {"continuous_usage_stats": True}):
        plain = _sse_chunks(server, path, {**body, "max_tokens": 4, "stream": True,
                                           "stream_options": options})
        assert all(c["usage"] is None for c in plain)


def test_text_chunk_with_usage_equals_the_pydantic_model():
    from specserve.server.protocol import ChatCompletionChunk, ChatStreamChoice, DeltaMessage
    from specserve.server.streaming import TextChunk

    def make(i: int, text: str, usage=None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id="chatcmpl-x", created=1, model='m "usage":null', usage=usage,
                                   choices=[ChatStreamChoice(index=i,
                                                             delta=DeltaMessage(content=text))])

    chunk = TextChunk(make)
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    for text in ("", ' say "hi"', "中文\n"):
        assert json.loads(chunk.render(1, text, (7, 3))) == json.loads(
            make(1, text, usage).model_dump_json())
        assert json.loads(chunk.render(1, text)) == json.loads(make(1, text).model_dump_json())


@pytest.mark.parametrize(("path", "extra", "name"), [
    ("/v1/completions", {"speculation": {"speculation_policy": "static"}}, "speculation_policy"),
    ("/v1/completions", {"use_beam_search": True, "stream": True}, "stream"),
    ("/v1/chat/completions", {"use_beam_search": True, "temperature": 0.8}, "temperature"),
    ("/v1/chat/completions", {"use_beam_search": True, "logprobs": True}, "logprobs"),
    ("/v1/completions", {"use_beam_search": True, "n": 11}, "n (the beam width)"),
    ("/v1/completions", {"length_penalty": 0.5}, "length_penalty"),
    ("/v1/completions", {"logits_processors": ["my.module:Processor"]}, "logits_processors"),
    ("/v1/chat/completions", {"functions": [{"name": "f", "parameters": {}}]}, "functions"),
    ("/v1/chat/completions", {"modalities": ["text", "audio"]}, "modalities"),
    ("/v1/chat/completions", {"chat_template": "{{ messages }}"}, "chat_template"),
])
def test_refuses_what_it_would_otherwise_ignore(server: LiveServer, path: str, extra: dict,
                                                name: str):
    """Known fields that change the output and that we do not implement get a 400 naming them
    (each used to be accepted and ignored)."""
    body = ({"prompt": "Hi"} if path == "/v1/completions"
            else {"messages": [{"role": "user", "content": "Hi"}]})
    resp = httpx.post(f"{server.url}{path}", json={**body, "max_tokens": 1, **extra},
                      timeout=60)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and name in error["message"], error


def test_accepts_the_values_that_leave_unsupported_fields_off(client: openai.OpenAI):
    resp = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=1, modalities=["text"],
        extra_body={"bad_words": [], "use_beam_search": False, "function_call": "auto",
                    "speculation": {"policy": "off"}})
    assert resp.usage.completion_tokens == 1


def test_a_long_prompt_is_tokenized_off_the_event_loop_to_the_same_ids(client: openai.OpenAI,
                                                                       llm):
    """Past TOKENIZE_INLINE_CHARS a prompt is tokenized on a worker thread: the same tokens (the
    usage counts them), for completions and chat."""
    from specserve.server.serving import TOKENIZE_INLINE_CHARS

    # A long separator line: many characters, few tokens (the server's context is short).
    prompt = "Below is a divider.\n" + "=" * TOKENIZE_INLINE_CHARS + "\nWhat was above?"
    assert len(prompt) > TOKENIZE_INLINE_CHARS
    resp = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    assert resp.usage.prompt_tokens == len(llm.engine.tokenize(prompt))
    messages = [{"role": "user", "content": prompt}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                          temperature=0)
    assert chat.usage.prompt_tokens == len(llm.engine.apply_chat_template(messages))


def test_a_speculating_server_streams_the_offline_text_and_counts_its_drafts(llm):
    """A server with an n-gram proposer under the static policy: a streamed greedy completion
    that copies a record equals the offline engine's text without speculation, the spec-decode
    counters move, and `"speculation": 0` in the body drafts nothing for that request."""
    prompt = 'Copy: {"id": 7, "name": "lamp", "tags": ["a", "b"]}\n{"id": 7, "name": "lamp",'
    text, num_tokens, _ = offline_text(llm, prompt, max_tokens=24)
    live = LiveServer(*MODEL_FLAGS, "--speculation-policy", "static", "--speculative-config",
                      '{"method": "ngram", "num_speculative_tokens": 4}')
    try:
        client = live.client()
        before = live.metrics()
        chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=24,
                                                temperature=0, stream=True))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == text
        after = live.metrics()
        drafted = "vllm:spec_decode_num_draft_tokens_total{}"
        assert after[drafted] > before[drafted]
        assert after["vllm:spec_decode_num_accepted_tokens_total{}"] > 0
        assert after["vllm:spec_decode_num_drafts_total{}"] > 0
        resp = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24,
                                         temperature=0, extra_body={"speculation": 0})
        assert resp.choices[0].text == text and resp.usage.completion_tokens == num_tokens
        assert live.metrics()[drafted] == after[drafted]
    finally:
        live.stop()


# ---- scoring a text: echo and prompt_logprobs ------------------------------------------------
def test_echo_and_prompt_logprobs_score_the_prompt_as_offline(server: LiveServer,
                                                              client: openai.OpenAI, llm):
    """lm-eval's loglikelihood request (token ids, echo, logprobs 1, max_tokens 1) and vLLM's
    prompt_logprobs field get the prompt's tokens scored as the offline engine scores them (its
    values are held to transformers' in test_engine_vs_hf), streamed and not."""
    tok = llm.get_tokenizer()
    ids = tok(PROMPTS[0], add_special_tokens=False).input_ids
    offline = llm.generate([ids], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True,
                                                 prompt_logprobs=1))[0]
    want = [entry and entry[t].logprob for entry, t in zip(offline.prompt_logprobs, ids,
                                                             strict=True)]
    reply = client.completions.create(model=MODEL, prompt=[ids], max_tokens=1, logprobs=1,
                                      echo=True, temperature=0)
    choice = reply.choices[0]
    lp = choice.logprobs
    first_token = tok.decode(offline.outputs[0].token_ids[:1])
    assert choice.text == PROMPTS[0] + first_token
    assert lp.tokens[:len(ids)] == [tok.decode([t]) for t in ids] and len(lp.tokens) == len(ids) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:len(ids)] == pytest.approx(want[1:], abs=1e-3)
    assert lp.text_offset[0] == 0 and lp.text_offset[len(ids)] == len(PROMPTS[0])
    # lm-eval's greedy test reads the top entry: the prompt token and the likeliest one
    for p in range(1, len(ids)):
        top = lp.top_logprobs[p]
        assert lp.tokens[p] in top and 1 <= len(top) <= 2
        assert (max(top.values()) == lp.token_logprobs[p]) == \
            (offline.prompt_logprobs[p][ids[p]].rank == 1)
    assert reply.usage.prompt_tokens == len(ids) and reply.usage.completion_tokens == 1
    # OpenAI's legacy scoring request: echo with max_tokens 0 scores the prompt, adds nothing.
    only = client.completions.create(model=MODEL, prompt=[ids], max_tokens=0, logprobs=1,
                                     echo=True)
    assert only.choices[0].text == PROMPTS[0] and only.choices[0].finish_reason == "length"
    assert only.choices[0].logprobs.token_logprobs == lp.token_logprobs[:len(ids)]
    assert only.usage.completion_tokens == 0
    streamed = _sse_chunks(server, "/v1/completions", {
        "prompt": PROMPTS[0], "echo": True, "max_tokens": 0, "stream": True})
    assert "".join(c["choices"][0]["text"] for c in streamed) == PROMPTS[0]
    assert streamed[-1]["choices"][0]["finish_reason"] == "length"
    # Streamed: the prompt first, in a chunk of its own, then the completion as without echo.
    chunks = _sse_chunks(server, "/v1/completions", {
        "prompt": PROMPTS[0], "echo": True, "logprobs": 0, "max_tokens": 3, "temperature": 0,
        "ignore_eos": True, "stream": True})
    head = chunks[0]["choices"][0]
    assert head["text"] == PROMPTS[0] and head["logprobs"]["token_logprobs"][0] is None
    assert head["logprobs"]["token_logprobs"][1:] == pytest.approx(want[1:], abs=1e-3)
    assert "".join(c["choices"][0]["text"] for c in chunks) == \
        PROMPTS[0] + offline_text(llm, PROMPTS[0], max_tokens=3, ignore_eos=True)[0]
    # Several prompts, n = 2 (choice 0 alone scores each prompt): every choice echoes its
    # prompt's scores, streamed or not.
    ids2 = tok(PROMPTS[1], add_special_tokens=False).input_ids
    want2 = [entry and entry[t].logprob for entry, t in zip(llm.generate(
        [ids2], SamplingParams(max_tokens=1, prompt_logprobs=0))[0].prompt_logprobs, ids2,
        strict=True)]
    both = client.completions.create(model=MODEL, prompt=[ids, ids2], n=2, echo=True,
                                      logprobs=0, max_tokens=2, temperature=0.7)
    streamed = _sse_chunks(server, "/v1/completions", {
        "prompt": [ids, ids2], "n": 2, "echo": True, "logprobs": 0, "max_tokens": 2,
        "temperature": 0.7, "stream": True})
    firsts = {}
    for chunk in streamed:
        for c in chunk["choices"]:
            firsts.setdefault(c["index"], c)
    for i, scored_prompt, w in ((0, ids, want), (1, ids, want), (2, ids2, want2),
                                (3, ids2, want2)):
        for got in (both.choices[i].logprobs.token_logprobs,
                    firsts[i]["logprobs"]["token_logprobs"]):
            assert got[0] is None
            assert got[1:len(scored_prompt)] == pytest.approx(w[1:], abs=1e-3)
    # A string prompt's special-token text is in the echoed text, so its offsets count it.
    special = client.completions.create(model=MODEL, prompt="<|im_start|>user\nHi", echo=True,
                                        logprobs=0, max_tokens=1)
    assert special.choices[0].text.startswith("<|im_start|>user\nHi")
    assert special.choices[0].logprobs.text_offset[:2] == [0, len("<|im_start|>")]
    # vLLM's prompt_logprobs field: by token id, with rank and text, on completions' choices
    # and on a chat response; a response that did not ask has no such key.
    body = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "prompt": [ids], "max_tokens": 1, "prompt_logprobs": 2}).json()
    scored = body["choices"][0]["prompt_logprobs"]
    assert scored[0] is None and len(scored) == len(ids)
    for p in range(1, len(ids)):
        entry = scored[p][str(ids[p])]
        assert entry["logprob"] == pytest.approx(want[p], abs=1e-3)
        assert entry["decoded_token"] == tok.decode([ids[p]]) and entry["rank"] >= 1
        assert 2 <= len(scored[p]) <= 3
    chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "messages": CHAT, "max_tokens": 1, "prompt_logprobs": 0}).json()
    assert len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]
    assert all(len(e) == 1 for e in chat["prompt_logprobs"][1:])
    plain = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "prompt": PROMPTS[0], "max_tokens": 1}).json()
    assert "prompt_logprobs" not in plain["choices"][0]
    # vLLM's truncate_prompt_tokens keeps the prompt's last k tokens; a cut prompt is echoed
    # as the tokens kept.
    cut = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=3, echo=True,
                                    temperature=0, extra_body={"truncate_prompt_tokens": 3,
                                                               "ignore_eos": True})
    kept = tok(PROMPTS[0]).input_ids[-3:]
    assert cut.usage.prompt_tokens == 3
    assert cut.choices[0].text == tok.decode(kept) + llm.generate([kept], SamplingParams(
        temperature=0, max_tokens=3, ignore_eos=True))[0].outputs[0].text
    chat_cut = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1,
                                              extra_body={"truncate_prompt_tokens": 5})
    assert chat_cut.usage.prompt_tokens == 5
    whole = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=1,
                                      extra_body={"truncate_prompt_tokens": -1})
    assert whole.usage.prompt_tokens == len(tok(PROMPTS[0]).input_ids)  # -1: the context
    # vLLM's return_tokens_as_token_ids names every logprob token by its id.
    named = client.completions.create(model=MODEL, prompt=[ids], max_tokens=3, logprobs=1,
                                      echo=True, temperature=0, extra_body={
                                          "return_tokens_as_token_ids": True,
                                          "ignore_eos": True})
    want_ids = ids + offline.outputs[0].token_ids
    assert named.choices[0].logprobs.tokens == [f"token_id:{t}" for t in want_ids]
    assert all(k.startswith("token_id:") for top in named.choices[0].logprobs.top_logprobs[1:]
               for k in top)
    chat_named = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=3, logprobs=True, top_logprobs=2, temperature=0,
        extra_body={"return_tokens_as_token_ids": True, "prompt_logprobs": 0})
    content = chat_named.choices[0].logprobs.content
    assert all(t.token.startswith("token_id:") and len(t.top_logprobs) == 2 and all(
        x.token.startswith("token_id:") for x in t.top_logprobs) for t in content)
    # prompt_logprobs are keyed by id already: their text stays (as in vLLM)
    assert all(v["decoded_token"] == tok.decode([int(k)]) for e in chat_named.prompt_logprobs[1:]
               for k, v in e.items())


# ---- vLLM's /tokenize and /detokenize ---------------------------------------------------------
def test_tokenize_and_detokenize_count_as_the_endpoints_do(server: LiveServer, client, llm):
    """A prompt's ids are the offline tokenizer's (what a completion's usage counts), a
    conversation's are what a chat completion's usage counts; detokenize inverts them."""
    tok = llm.get_tokenizer()
    text = "The capital of France is Paris. 中文"
    body = httpx.post(f"{server.url}/tokenize", timeout=60, json={
        "model": MODEL, "prompt": text, "return_token_strs": True}).json()
    assert body["tokens"] == tok(text).input_ids and body["count"] == len(body["tokens"])
    assert body["token_strs"] == tok.convert_ids_to_tokens(body["tokens"])
    assert body["max_model_len"] == client.models.list().data[0].max_model_len
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1)
    chat = httpx.post(f"{server.url}/tokenize", timeout=60, json={"messages": CHAT}).json()
    assert chat["count"] == reply.usage.prompt_tokens and chat["token_strs"] is None
    back = httpx.post(f"{server.url}/detokenize", timeout=60,
                      json={"model": MODEL, "tokens": body["tokens"]}).json()
    assert back == {"prompt": text}


# ---- shutdown (last: it stops this module's server) ------------------------------------------
def test_sigterm_to_any_thread_stops_an_idle_server(server: LiveServer):
    """Python runs signal handlers only in the main thread, the engine loop's in `specserve
    serve`, and a signal may be delivered to any thread that does not block it. Sent to another
    thread while the engine sleeps for want of work, SIGTERM must still stop the server (it was
    ignored until the next request came)."""
    tgkill = getattr(ctypes.CDLL(None, use_errno=True), "tgkill", None)  # glibc >= 2.30
    if tgkill is None or not os.path.isdir("/proc/self/task"):
        pytest.skip("needs Linux's /proc and glibc's tgkill")
    assert wait_until(lambda: kv_pool_is_free(server)), server.stats()  # idle
    pid = server.proc.pid
    # A thread that takes SIGTERM (one that blocks it would keep it pending forever).
    takers = [tid for tid in sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
              if tid != pid and not _blocks(pid, tid, signal.SIGTERM)]
    assert takers, "every thread but the main one blocks SIGTERM"
    assert tgkill(pid, takers[-1], signal.SIGTERM) == 0, os.strerror(ctypes.get_errno())
    # Before the fix it never exited; after it, within the idle wait's 0.5 s.
    assert server.exit_code(15, "SIGTERM") == 0, server.output()


def _blocks(pid: int, tid: int, sig: int) -> bool:
    """Whether thread tid of process pid blocks sig (its SigBlk mask in /proc); a thread that
    has exited meanwhile counts as blocking (it cannot take the signal)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigBlk:"))
    except FileNotFoundError:
        return True
    return bool(mask >> (sig - 1) & 1)
