"""`specserve bench online`: the same closed loop as the lab, over HTTP, against any
OpenAI-compatible server (ours, vLLM, llama.cpp's server).

Each request is a streaming chat completion (greedy). TTFT is measured at the first chunk that
carries tokens (content, reasoning_content or tool_calls, as vLLM's benchmark_serving counts); the
token count comes from the final usage chunk (`stream_options.include_usage`), because one chunk
may carry several tokens (a verified speculative run) or none; TPOT is the time from the first to
the last such chunk over (tokens - 1).

`--compare-offline` runs the same requests in-process: each sampled as a specserve server
samples the body (offline_workload), both sides warmed on the same first prompt, and every
json-schema grammar compiled before the first timed run on both sides.

The client is aiohttp on uvloop, as lean as we could make it: on this 2-core machine the load
generator shares the CPU with the server, so its own cost shows up as the server's. Measured at
concurrency 32: ~26-28 µs of CPU per streamed token (httpx spent ~90 µs, aiohttp's line
iterator on asyncio's loop ~30 µs), most of it the kernel's socket receive; at concurrency 1 a
token costs the client ~200 µs, every wake-up starting from caches the forward has just flushed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import replace

import aiohttp
import uvloop

from specserve.bench.lab import (
    PreparedWorkload,
    RequestRecord,
    item_max_tokens,
    latency_figures,
    prepare_workload,
)
from specserve.bench.workloads import WorkloadItem
from specserve.engine.llm_engine import LLMEngine

# Errors a bench run reports as one line (server down, refused, timed out).
CLIENT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


class OnlineError(RuntimeError):
    pass


async def discover_model(session: aiohttp.ClientSession, url: str, headers: dict) -> str:
    """The first model the server lists (what `--model` defaults to)."""
    async with session.get(f"{url}/v1/models", headers=headers) as resp:
        resp.raise_for_status()
        data = (await resp.json()).get("data") or []
    if not data:
        raise OnlineError(f"{url}/v1/models lists no model; pass --model")
    return data[0]["id"]


def carries_tokens(delta: dict) -> bool:
    """Whether a chunk's delta holds generated tokens. usage's completion_tokens counts a
    reasoning model's thinking (reasoning_content, or vLLM's newer `reasoning`) and a tool
    call's arguments too: timing only `content` would make TTFT the time to the first answer
    token and divide the answer's span by every token."""
    return bool(delta.get("content") or delta.get("reasoning_content")
                or delta.get("reasoning") or delta.get("tool_calls"))


async def stream_one(session: aiohttp.ClientSession, url: str, headers: dict, body: dict
                     ) -> RequestRecord:
    t0 = time.perf_counter()
    first = last = None
    num_chunks_with_content = 0
    usage = None
    async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
        if resp.status != 200:
            text = (await resp.read()).decode(errors="replace")
            raise OnlineError(f"HTTP {resp.status}: {text[:500]}")
        # Whatever bytes arrived, split into events here: one await per read instead of two
        # per event (aiohttp's line iterator), and every event of a read shares its arrival time.
        pending = b""
        async for data in resp.content.iter_any():
            now = time.perf_counter()
            *events, pending = (pending + data).replace(b"\r\n", b"\n").split(b"\n\n")
            for event in events:
                if not event.startswith(b"data:"):
                    continue
                payload = event[5:].strip()
                if payload == b"[DONE]":
                    break
                chunk = json.loads(payload)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or ():
                    if carries_tokens(choice.get("delta") or {}):
                        last = now
                        first = first or now
                        num_chunks_with_content += 1
                    elif choice.get("finish_reason") and first is not None:
                        # A reply that ends on EOS (or a stop token) ends with a chunk without
                        # text, sent by the step that generated that token: usage counts the
                        # token, so its step belongs to the span (as the offline TPOT has it).
                        last = now
    end = time.perf_counter()
    # Without usage (a server that ignores stream_options) chunks are the best guess.
    n = usage["completion_tokens"] if usage else num_chunks_with_content
    prompt_tokens = usage["prompt_tokens"] if usage else 0
    tpot = (last - first) / (n - 1) if first is not None and n > 1 else None
    return RequestRecord(prompt_tokens, n, (first or end) - t0, tpot)


def run_client(coro):
    """Run a client coroutine on uvloop (what the server runs on): ~10% less client CPU per
    streamed token than asyncio's default loop, all of it taken from the server's cores here."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


WARM_UP_TOKENS = 4


def request_body(item: WorkloadItem, model: str, max_tokens_cap: int | None = None,
                 ignore_eos: bool = False) -> dict:
    """One streaming chat request. Fields it leaves unset (top_p, repetition_penalty, ...) are
    the server's to fill: specserve and vLLM take them from the model's generation_config.json,
    which offline_workload applies to the in-process side too."""
    body = {"model": model, "messages": item.messages, "temperature": 0.0,
            "max_tokens": item_max_tokens(item, max_tokens_cap), "stream": True,
            "stream_options": {"include_usage": True}}
    if ignore_eos:  # an extension (ours, vLLM and llama.cpp's server accept it)
        body["ignore_eos"] = True
    if item.structured_outputs:  # json-schema: vLLM's body field
        body["structured_outputs"] = item.structured_outputs
    return body


def offline_workload(engine: LLMEngine, name: str, items: Sequence[WorkloadItem],
                     max_tokens_cap: int | None = None) -> PreparedWorkload:
    """The workload as --compare-offline runs it in-process: each request sampled as a
    specserve server samples request_body (protocol's to_sampling_params): the body's fields on
    top of the engine's defaults from the model's generation_config.json (Qwen2.5-Instruct's
    sets repetition_penalty 1.05), max_tokens capped at its max_new_tokens (serving's _capped).
    A bare SamplingParams would decode without that penalty: another workload."""
    caps = [c for c in (max_tokens_cap, engine.sampling_defaults.get("max_tokens")) if c]
    workload = prepare_workload(engine, name, items, cap=min(caps, default=None))
    return replace(workload, defaults=engine.default_sampling_params())


def warm_up_offline(engine: LLMEngine, workload: PreparedWorkload,
                    ignore_eos: bool = False) -> None:
    """The in-process twin of run_online_point's warm-up request: the same first prompt, so
    that both sides start their first timed run with it in the prefix cache."""
    cap = engine.sampling_defaults.get("max_tokens") or WARM_UP_TOKENS
    engine.add_request(workload.prompts[0], replace(workload.params(0, ignore_eos),
                                                    max_tokens=min(WARM_UP_TOKENS, cap)))
    while engine.has_unfinished_requests():
        engine.step()


async def run_online_point(url: str, items: Sequence[WorkloadItem], concurrency: int,
                           num_prompts: int, model: str | None = None,
                           api_key: str | None = None, max_tokens_cap: int | None = None,
                           ignore_eos: bool = False, timeout: float = 600.0,
                           warm_up: bool = True) -> dict:
    """Closed loop: `concurrency` workers, each sending its next request as soon as its previous
    one finished, until num_prompts have been sent (items cycled)."""
    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    connector = aiohttp.TCPConnector(limit=concurrency + 4)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        model = model or await discover_model(session, url, headers)
        bodies = [request_body(items[i % len(items)], model, max_tokens_cap, ignore_eos)
                  for i in range(num_prompts)]
        if warm_up:  # the server's first forwards are slow: keep them out of the figures
            # The first prompt (rag: the shared document) then starts in the prefix cache;
            # --compare-offline warms its engine the same way (warm_up_offline).
            await stream_one(session, url, headers, {**bodies[0], "max_tokens": WARM_UP_TOKENS})
            # Every grammar compiled before the clock starts, as prepare_workload compiles the
            # in-process side's: one token per distinct schema, on a prompt of its own (the
            # workload's prompts must not enter the prefix cache here).
            for so in {json.dumps(i.structured_outputs, sort_keys=True): i.structured_outputs
                       for i in items if i.structured_outputs}.values():
                await stream_one(session, url, headers, {
                    **bodies[0], "messages": [{"role": "user", "content": "Reply in JSON."}],
                    "max_tokens": 1, "structured_outputs": so})
        records: list[RequestRecord | None] = [None] * num_prompts
        next_index = iter(range(num_prompts))
        t0 = time.perf_counter()

        async def worker() -> None:
            for i in next_index:  # a shared iterator: each index is taken exactly once
                start = time.perf_counter() - t0
                rec = await stream_one(session, url, headers, bodies[i])
                rec.start_s, rec.end_s = start, time.perf_counter() - t0
                records[i] = rec

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    done = [r for r in records if r is not None]
    return {"concurrency": concurrency, "num_prompts": num_prompts, "model": model,
            **latency_figures(done, wall),
            "requests": [{"prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
                          "ttft_s": r.ttft_s, "tpot_s": r.tpot_s, "start_s": r.start_s,
                          "end_s": r.end_s} for r in done]}
