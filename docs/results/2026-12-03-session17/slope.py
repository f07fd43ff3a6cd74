"""Target forward time at n sequences x q tokens, interleaved (cold-ish, as in serving), vs the profile."""
import os, time, torch, random
from specserve.bench.lab import build_llm, proposer_config
from specserve.spec_decode import profiler as P
DRAFT = os.path.expanduser("~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-3")
llm = build_llm(None, {"speculative_config": proposer_config("draft", 4, draft_model=DRAFT),
                       "speculation_policy": "adaptive", "kv_cache_memory": "2GiB"})
e = llm.engine
tc = e.spec_policy.target_cost
print("profile T(n) ms:", {int(x): round(1e3 * tc(x), 2) for x in (1, 2, 3, 4, 6, 8, 12, 16)})
t, d = e.runner, e.proposer.runner
shapes = {}
for n, q in ((1, 1), (1, 3), (1, 5), (2, 1), (2, 3), (2, 5), (4, 1), (4, 3)):
    shapes[(n, q)] = t.prepare([(P._fake_seq(t, i, 160, q), q) for i in range(n)])
di = d.prepare([(P._fake_seq(d, 0, 128), 1)])
times = {k: [] for k in shapes}
keys = list(shapes) * 25
random.seed(0); random.shuffle(keys)
for k in keys:
    d.execute(di, torch.arange(1))
    t0 = time.perf_counter(); t.execute(shapes[k], torch.arange(k[0] * k[1])); times[k].append(time.perf_counter() - t0)
for k, v in times.items():
    v.sort()
    print(f"{k[0]} seqs x {k[1]} tokens = {k[0]*k[1]:2d}: median {v[len(v)//2]*1e3:.2f} ms  p25 {v[len(v)//4]*1e3:.2f}")
