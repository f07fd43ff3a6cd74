import json, time
from specserve import LLM, SamplingParams
base = json.load(open("/tmp/audit2/t3_base_noprefix_chunked_seqs1.json"))["base"]
doc = "Alice went to the market. She bought apples, oranges and pears. " * 20
prompts = ["The capital of France is",
           "def fibonacci(n):\n    if n <= 1:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\ndef factorial(n):",
           doc + "\nQuestion: what did Alice buy? Answer:",
           doc + "\nSummarize the text above in one sentence:",
           '{"name": "Bob", "age": 31, "city": "Paris"}\n{"name": "Eve", "age": 27, "city":']
for sc in [{"method":"draft","model":"/tmp/audit2/d1","num_speculative_tokens":3}, {"method":"draft","model":"/tmp/audit2/d1","quantization":"int4"}]:
    t=time.time()
    try:
        llm = LLM(dtype="float32", kv_cache_memory="512MiB", speculative_config=sc, speculation_policy="static")
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
        s = llm.get_stats()
        print(sc, f"{time.time()-t:.1f}s", [o.outputs[0].token_ids == b[:12] for o,b in zip(outs, base)], s["num_draft_tokens"], s["acceptance_rate"], s["draft_weight_bytes"]>>20, s["kv_blocks_free"], s["kv_blocks_total"])
    except Exception as e:
        import traceback; traceback.print_exc()
