"""What the reply cache costs on the engine thread: adding a reply, a look-up (a miss, and a
hit where 200 replies share the text), and the eviction of the oldest half of a full cache
(10,000 replies of 250 tokens, the default size). Random tokens, one thread.

  .venv/bin/python docs/results/2026-12-07-session50/reply_cache_cost.py
"""
import random
import time

from specserve.spec_decode.suffix import ReplyCache

rng = random.Random(0)
cache = ReplyCache(max_replies=10000, max_depth=24)
replies = [[rng.randrange(49152) for _ in range(250)] for _ in range(10000)]
t = time.perf_counter()
for r in replies:
    cache.add(r)
add_s = time.perf_counter() - t
arrays = len(cache.tokens) * cache.tokens.itemsize + len(cache.prev) * cache.prev.itemsize
print(f"add: {add_s / (250 * 10000) * 1e6:.2f} us per token ({cache.num_replies} replies, "
      f"{len(cache.tokens)} tokens, {arrays / 2**20:.1f} MiB of arrays + "
      f"{len(cache.head) * cache.head.itemsize / 2**20:.0f} MiB table)")
t = time.perf_counter()
cache.add(replies[0])  # the 10,001st: the oldest half goes
print(f"eviction of the oldest {10000 - cache.num_replies + 1} replies: "
      f"{(time.perf_counter() - t) * 1e3:.0f} ms")
ctx = [rng.randrange(49152) for _ in range(500)]
t = time.perf_counter()
for _ in range(2000):
    cache.lookup(ctx, 4, 0.1, 1.0)
print(f"look-up, no match: {(time.perf_counter() - t) / 2000 * 1e6:.1f} us")
shared = [rng.randrange(49152) for _ in range(250)]
for _ in range(200):
    cache.add(shared)
t = time.perf_counter()
for _ in range(2000):
    guess = cache.lookup(shared[:100], 4, 0.1, 1.0)
print(f"look-up, 24-token match in 200 replies (32 looked at): "
      f"{(time.perf_counter() - t) / 2000 * 1e6:.1f} us -> {guess}")
