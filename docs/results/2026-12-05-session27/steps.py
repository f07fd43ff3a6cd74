import time, sys
from specserve import LLM, SamplingParams
from specserve.bench.offline import make_prompts
llm = LLM(); e = llm.engine
out = []
for c, n in [(1, 60), (32, 60), (64, 40)]:
    prompts = make_prompts(llm.get_tokenizer(), c, 128)
    p = SamplingParams(temperature=0, max_tokens=100000, ignore_eos=True)
    ids = [e.add_request(x, p).request_id for x in prompts]
    while e.scheduler.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in e.scheduler.running):
        e.step()
    for _ in range(5): e.step()
    t0 = time.perf_counter()
    for _ in range(n): e.step()
    out.append(f"c{c} {(time.perf_counter()-t0)/n*1e3:.2f}")
    for i in ids: e.abort_request(i)
print(" ".join(out), flush=True)
