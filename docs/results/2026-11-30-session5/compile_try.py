"""torch.compile of the model forward at batch-1 decode, on the pure-PyTorch path."""
import os, sys, time
os.environ["SPECSERVE_NO_EXT"] = "1"
import torch
from specserve.llm import LLM
from specserve.sampling_params import SamplingParams
from specserve.bench.offline import make_prompts
q = sys.argv[1] if len(sys.argv) > 1 else "gguf"
llm = LLM(quantization=q)
eng = llm.engine
p = make_prompts(llm.get_tokenizer(), 1, 128)
eng.add_request(p[0], SamplingParams(temperature=0, max_tokens=10000, ignore_eos=True))
for _ in range(5): eng.step()
r = eng.runner
req = eng.scheduler.running[0]
inputs = r.prepare([(req, 1)])
args = (inputs.input_ids, inputs.positions, r.kv_caches, inputs.meta)
def bench(f, n=50):
    for _ in range(5): f(*args)
    t0 = time.perf_counter()
    for _ in range(n): f(*args)
    return (time.perf_counter() - t0) / n * 1e3
eager = bench(r.model.forward)
print(f"eager (no extension) forward: {eager:.2f} ms", flush=True)
fwd = type(r.model).forward.__wrapped__
import functools
compiled0 = torch.compile(functools.partial(fwd, r.model), dynamic=False)
def compiled(*a):
    with torch.no_grad():
        return compiled0(*a)
t0 = time.perf_counter()
with torch.no_grad():
    out_c = compiled(*args)
print(f"compile: {time.perf_counter() - t0:.1f} s", flush=True)
out_e = r.model.forward(*args)
print("max diff", (out_c.float() - out_e.float()).abs().max().item())
print(f"compiled forward: {bench(compiled):.2f} ms")
