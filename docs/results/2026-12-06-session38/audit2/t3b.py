import time, sys, os, json
from specserve import LLM, SamplingParams
doc = "Alice went to the market. She bought apples, oranges and pears. " * 20
prompts = ["The capital of France is",
           "def fibonacci(n):\n    if n <= 1:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\ndef factorial(n):",
           doc + "\nQuestion: what did Alice buy? Answer:",
           doc + "\nSummarize the text above in one sentence:",
           '{"name": "Bob", "age": 31, "city": "Paris"}\n{"name": "Eve", "age": 27, "city":']
MT=int(os.environ.get("MT","24"))
G = SamplingParams(temperature=0, max_tokens=MT, ignore_eos=True)
base=json.load(open("/tmp/audit2/t3_base_noprefix_chunked_seqs1.json"))["base"]
configs = {
 "base": dict(),
 "noprefix": dict(enable_prefix_caching=False),
 "chunked": dict(long_prefill_token_threshold=16, max_num_batched_tokens=64),
 "seqs1": dict(max_num_seqs=1),
 "ngram_static": dict(speculative_config={"method":"ngram","num_speculative_tokens":4}, speculation_policy="static"),
 "draft4_static": dict(speculative_config={"method":"draft","draft_layers":4,"num_speculative_tokens":3}, speculation_policy="static"),
 "eagle_static": dict(speculative_config={"method":"eagle","model":os.path.expanduser("~/.cache/specserve/drafts/s32-eagle-r8"),"num_speculative_tokens":3}, speculation_policy="static"),
 "ngram_adaptive": dict(speculative_config={"method":"ngram"}),
}
only = sys.argv[1:] or list(configs)
ref = None
import json
res = {}
for name in only:
    t = time.time()
    try:
        llm = LLM(dtype="float32", kv_cache_memory=os.environ.get("KV","256MiB"), **configs[name])
    except Exception as e:
        print(name, "LOAD EXC", type(e).__name__, e); continue
    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, G)]
    outs2 = [o.outputs[0].token_ids for o in llm.generate(prompts, G)]  # second run: prefix cache hits
    s = llm.get_stats()
    res[name] = outs
    keys = ["num_steps","num_prompt_tokens","num_generated_tokens","kv_blocks_free","kv_blocks_total","prefix_cache_queries","prefix_cache_hits","num_draft_tokens","num_accepted_tokens","num_verifications","acceptance_rate","mean_accepted_length","num_preemptions"]
    print(name, f"{time.time()-t:.1f}s", "same-as-rerun:", outs==outs2, {k:s.get(k) for k in keys}, flush=True)
    if True:
        ref=("base",[b[:MT] for b in base])
        diff = [i for i,(a,b) in enumerate(zip(ref[1], outs)) if a!=b]
        print("   vs", ref[0], "differs at prompts", diff, flush=True)
    del llm
json.dump(res, open("/tmp/audit2/t3_"+"_".join(only)+".json","w"))
