import time, sys
from specserve import LLM, SamplingParams
from specserve.bench.offline import make_prompts
llm = LLM()
eng = llm.engine
tok = llm.get_tokenizer()
params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
allp = make_prompts(tok, 16 * 12, 128)
ex = eng.runner.execute
log = []
def timed(inputs, *a, **k):
    t = time.perf_counter(); r = ex(inputs, *a, **k); log.append((inputs.input_ids.numel(), round((time.perf_counter() - t)*1e3, 1))); return r
eng.runner.execute = timed
for i in range(12):
    for p in allp[16*i:16*(i+1)]:
        eng.add_request(p, params)
    while eng.has_unfinished_requests():
        eng.step()
    print(i, log); log.clear()
