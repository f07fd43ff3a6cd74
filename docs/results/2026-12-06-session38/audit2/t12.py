from specserve import LLM, SamplingParams
import traceback
llm = LLM(dtype="float32", kv_cache_memory="64MiB")
try:
    o = llm.generate(["Hello", "World"], [SamplingParams(temperature=0, max_tokens=4), SamplingParams(temperature=0, max_tokens=4, logprobs=1.5)])
    print("ok", [x.outputs[0].logprobs for x in o])
except Exception as e:
    traceback.print_exc(limit=-2)
s = llm.get_stats(); print({k:s[k] for k in ["num_running","num_waiting","kv_blocks_free","kv_blocks_total"]}, len(llm.engine.requests))
print(llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4))[0].outputs[0].text)
