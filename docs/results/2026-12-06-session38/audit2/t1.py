import time; t=time.time()
from specserve import LLM, SamplingParams
llm = LLM(dtype="float32", kv_cache_memory="256MiB")
print("load", time.time()-t)
g = SamplingParams(temperature=0, max_tokens=32)
outs = llm.generate(["The capital of France is", "def fib(n):"], g)
for o in outs: print(repr(o.outputs[0].text), o.outputs[0].finish_reason, len(o.outputs[0].token_ids))
print(llm.get_stats())
o = outs[0]
print(o)
