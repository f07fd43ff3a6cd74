import sys
from specserve import LLM
from specserve.bench.offline import make_prompts, bench_engine
llm = LLM()
c = int(sys.argv[1]) if len(sys.argv) > 1 else 64
prompts = make_prompts(llm.get_tokenizer(), c, 128)
print("ready", flush=True)
for rep in range(int(sys.argv[2]) if len(sys.argv) > 2 else 6):
    llm.engine.block_manager.reset_prefix_cache()
    r = bench_engine(llm, prompts, 128)
    print(f"tok/s {r.output_tok_s:.1f}", flush=True)
