from specserve import LLM, SamplingParams
import traceback
for kw in [dict(long_prefill_token_threshold=0), dict(long_prefill_token_threshold=-5), dict(max_num_seqs=0)]:
    try:
        llm = LLM(dtype="float32", kv_cache_memory="64MiB", **kw)
        print(kw, "constructed")
        print(llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=3))[0].outputs[0].text)
    except Exception as e:
        print(kw, type(e).__name__, e); traceback.print_exc(limit=-3)
