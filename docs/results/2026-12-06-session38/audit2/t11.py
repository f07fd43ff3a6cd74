from specserve import LLM, SamplingParams, StructuredOutputsParams as SO
P = ['{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7, "h": 8, "a": 1, "b":', "The cat sat on the mat. The cat sat on the", "List three fruits:"]
schema = {"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["a","b"]}
llm = LLM(dtype="float32", kv_cache_memory="384MiB", speculative_config={"method":"draft","draft_layers":2,"num_speculative_tokens":3}, speculation_policy="static")
cases = {"rep_pen": dict(repetition_penalty=1.3), "freq_pres": dict(frequency_penalty=0.8, presence_penalty=0.5), "bias": dict(logit_bias={11:5.0, 28:-3.0}),
         "min_tokens": dict(min_tokens=20, max_tokens=24), "schema": dict(structured_outputs=SO(json=schema)), "logprobs": dict(logprobs=3)}
for name, kw in cases.items():
    kw = dict(kw); mt = kw.pop("max_tokens", 20)
    a = llm.generate(P, SamplingParams(temperature=0, max_tokens=mt, **kw))
    b = llm.generate(P, SamplingParams(temperature=0, max_tokens=mt, num_speculative_tokens=0, **kw))
    same = [x.outputs[0].token_ids == y.outputs[0].token_ids for x,y in zip(a,b)]
    extra = ""
    if name=="logprobs":
        extra = max(abs(x.outputs[0].logprobs[i][t]-y.outputs[0].logprobs[i][t]) for x,y in zip(a,b) for i,t in enumerate(x.outputs[0].token_ids))
    print(name, same, [x.outputs[0].finish_reason for x in a], extra, flush=True)
s = llm.get_stats(); print(s["num_draft_tokens"], s["acceptance_rate"], s["kv_blocks_free"], s["kv_blocks_total"])
llm.generate([{"prompt_token_ids": [1,2,3]}], SamplingParams(max_tokens=4), use_tqdm=True); print("tqdm ok")
