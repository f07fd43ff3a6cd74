"""The body guidellm sends, against a plain one, from a minimal aiohttp client: 64 streaming chat
requests at concurrency 32 per variant (plain, usage = stream_options with
continuous_usage_stats, parts = content as a list of text parts). The server must be up:

    specserve serve --port 8013 & python body_ab.py plain usage parts usage+parts plain
"""
import asyncio
import pathlib
import sys
import time

import aiohttp

URL = "http://127.0.0.1:8013/v1/chat/completions"
TEXT = (pathlib.Path(__file__).parent / "guidellm_prompt.txt").read_text()
def body(variant):
    b = {"model": "SmolLM2-135M-Instruct", "stream": True, "max_completion_tokens": 64, "ignore_eos": True,
         "messages": [{"role": "user", "content": TEXT}]}
    if "usage" in variant: b["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if "parts" in variant: b["messages"][0]["content"] = [{"type": "text", "text": TEXT}]
    return b
async def one(s, b):
    n = 0
    async with s.post(URL, json=b) as r:
        async for line in r.content:
            if line.startswith(b"data: ") and b"[DONE]" not in line: n += 1
    return n
async def run(variant, conc=32, total=64):
    async with aiohttp.ClientSession() as s:
        sem = asyncio.Semaphore(conc)
        async def job():
            async with sem: return await one(s, body(variant))
        t = time.perf_counter(); chunks = await asyncio.gather(*[job() for _ in range(total)])
        dt = time.perf_counter() - t
        print(f"{variant:12s} {64*total/dt:7.1f} tok/s  chunks/req {sum(chunks)/total:.0f}", flush=True)
for v in sys.argv[1:]:
    asyncio.run(run(v))
