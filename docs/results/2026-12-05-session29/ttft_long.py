"""Time to the first token of one prompt of 512 / 2,048 / 4,096 tokens (median of 3 prompts, prefix cache
reset). Optional argument: model_runner.KERNEL_QUERY_LEN (256 = before session 29: longer prompts took the
gather path). DT=float32 for fp32."""
import sys, time, statistics
import specserve.engine.model_runner as mr
if len(sys.argv) > 1: mr.KERNEL_QUERY_LEN = int(sys.argv[1])
from specserve import LLM, SamplingParams
from specserve.bench.offline import make_prompts
import os; llm = LLM(dtype=os.environ.get("DT", "auto"))
for n in (512, 2048, 4096):
    prompts = make_prompts(llm.get_tokenizer(), 3, n)
    ts = []
    for p in prompts:
        llm.engine.block_manager.reset_prefix_cache()
        t = time.perf_counter(); llm.generate([p], SamplingParams(temperature=0, max_tokens=1)); ts.append(time.perf_counter() - t)
    print(f"prompt {n}: TTFT {statistics.median(ts)*1e3:.0f} ms ({', '.join(f'{x*1e3:.0f}' for x in ts)})", flush=True)
