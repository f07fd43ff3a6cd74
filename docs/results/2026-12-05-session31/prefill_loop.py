import time, sys, os
import torch
from specserve import LLM, SamplingParams
llm = LLM()
eng = llm.engine
params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
g = torch.Generator().manual_seed(0)
n = int(os.environ.get("N", "20"))
ex = eng.runner.execute
log = []
def timed(inputs, *a, **k):
    t = time.perf_counter(); r = ex(inputs, *a, **k); log.append((time.perf_counter() - t)*1e3); return r
eng.runner.execute = timed
print("ready", flush=True)
for i in range(n):
    for _ in range(16):
        eng.add_request(torch.randint(100, 40000, (128,), generator=g).tolist(), params)
    while eng.has_unfinished_requests():
        eng.step()
print("median ms", sorted(log)[len(log)//2], [round(x) for x in log])
