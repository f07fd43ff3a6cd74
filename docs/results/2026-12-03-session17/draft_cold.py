import os, time, torch
from specserve.bench.lab import build_llm, proposer_config
from specserve.spec_decode import profiler as P
DRAFT = os.path.expanduser("~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-3")
llm = build_llm(None, {"speculative_config": proposer_config("draft", 4, draft_model=DRAFT),
                       "speculation_policy": "static", "kv_cache_memory": "2GiB"})
e = llm.engine
d, t = e.proposer.runner, e.runner
di = d.prepare([(P._fake_seq(d, 0, 128), 1)])
ti = t.prepare([(P._fake_seq(t, 0, 128, 3), 3)])
for _ in range(5): d.execute(di, torch.arange(1)); t.execute(ti, torch.arange(3))
warm, cold, cold2 = [], [], []
for _ in range(30):
    t0 = time.perf_counter(); d.execute(di, torch.arange(1)); warm.append(time.perf_counter() - t0)
for _ in range(30):
    t.execute(ti, torch.arange(3))
    t0 = time.perf_counter(); d.execute(di, torch.arange(1)); t1 = time.perf_counter()
    d.execute(di, torch.arange(1)); t2 = time.perf_counter()
    cold.append(t1 - t0); cold2.append(t2 - t1)
med = lambda x: sorted(x)[len(x)//2] * 1e3
print(f"warm {med(warm):.2f} ms; right after a target forward {med(cold):.2f} ms; the next one {med(cold2):.2f} ms")
