import time, statistics
from specserve import LLM, SamplingParams
from specserve.bench.offline import make_prompts
llm = LLM()
for n in (512, 2048, 4096):
    prompts = make_prompts(llm.get_tokenizer(), 3, n)
    ts = []
    for p in prompts:
        llm.engine.block_manager.reset_prefix_cache()
        t = time.perf_counter(); llm.generate([p], SamplingParams(temperature=0, max_tokens=1)); ts.append(time.perf_counter() - t)
    print(f"prompt {n}: TTFT {statistics.median(ts)*1e3:.0f} ms ({', '.join(f'{x*1e3:.0f}' for x in ts)})", flush=True)
