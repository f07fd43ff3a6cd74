"""Reruns the audit's reproductions of D1 (logprobs + speculation + a stop inside accepted
drafts), D2 (a seeded sampled request under load) and D3 (responses still open at
--shutdown-timeout) against `specserve serve` at this checkout, with the audit's flags.
Run from the repository root: .venv/bin/python docs/results/2026-12-06-session38/audit/verify_fixes.py"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx

URL = "http://127.0.0.1:8765"
LIST = "List: apple, banana, cherry, apple, banana, cherry, apple, banana, cherry, apple, banana,"


def serve(*flags: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "specserve.server.api_server", "--port", "8765",
                             "--log-level", "warning", *flags],
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    while True:
        try:
            if httpx.get(f"{URL}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.5)


def completion(body: dict, **kw) -> httpx.Response:
    return httpx.post(f"{URL}/v1/completions", json=body, timeout=120, **kw)


auth = {"Authorization": "Bearer secret"}
proc = serve("--api-key", "secret", "--speculative-config",
             '{"method": "ngram", "num_speculative_tokens": 4}')
print("D1: logprobs, static K = 4, a stop string met inside accepted drafts")
for stop in ({"stop": "cherry, apple, banana, cherry"}, {"stop_token_ids": [28]}):
    r = completion({"prompt": LIST, "max_tokens": 40, "temperature": 0, "logprobs": 0,
                    "speculation": {"num_speculative_tokens": 4, "policy": "static"}, **stop},
                   headers=auth)
    c = r.json()["choices"][0] if r.status_code == 200 else None
    print(f"  {stop}: HTTP {r.status_code}",
          f"finish {c['finish_reason']}, {len(c['logprobs']['tokens'])} logprob entries"
          if c else r.text[:200])
print("D2: a seeded sampled request alone, then 3 times beside an 80-token request")
seeded = {"prompt": LIST, "max_tokens": 40, "temperature": 0.7, "seed": 11}
alone = completion(seeded, headers=auth).json()["choices"][0]["text"]
same = []
for _ in range(3):
    other = threading.Thread(target=completion, args=(
        {"prompt": "Tell me a long story about dragons.", "max_tokens": 80,
         "temperature": 1.0},), kwargs={"headers": auth})
    other.start()
    time.sleep(0.3)
    same.append(completion(seeded, headers=auth).json()["choices"][0]["text"] == alone)
    other.join()
print(f"  the same text as alone: {same}")
proc.send_signal(signal.SIGTERM)
print(f"  server exit code {proc.wait()}")

print("D3: SIGTERM with --shutdown-timeout 3, a stream and a plain request of 3000 tokens open")
proc = serve("--shutdown-timeout", "3")
out = {}


def stream() -> None:
    with httpx.stream("POST", f"{URL}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "Write a long story."}],
            "max_tokens": 3000, "temperature": 0, "ignore_eos": True, "stream": True}) as r:
        out["stream"] = [line for line in r.iter_lines() if line]


def plain() -> None:
    r = completion({"prompt": "Write", "max_tokens": 3000, "ignore_eos": True})
    out["plain"] = (r.status_code, r.text[:200])


clients = [threading.Thread(target=stream), threading.Thread(target=plain)]
for t in clients:
    t.start()
time.sleep(3)
t0 = time.monotonic()
proc.send_signal(signal.SIGTERM)
for t in clients:
    t.join()
print(f"  clients done {time.monotonic() - t0:.1f} s after SIGTERM")
print(f"  stream's last events: {[e[:160] for e in out['stream'][-2:]]}")
print(f"  plain request: HTTP {out['plain'][0]} {json.loads(out['plain'][1])['error']['type']}"
      if out["plain"][0] != 200 else f"  plain request: {out['plain']}")
print(f"  server exit code {proc.wait()} after {time.monotonic() - t0:.1f} s")
