from specserve import LLM, SamplingParams
P = ['{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7, "h": 8, "a": 1, "b":']
G = lambda **k: SamplingParams(temperature=0, max_tokens=12, **k)
llm = LLM(dtype="float32", kv_cache_memory="64MiB", speculation_policy="static")
print("static w/o config: spec_method", llm.get_stats()["spec_method"], llm.engine.spec_policy)
llm = LLM(dtype="float32", kv_cache_memory="64MiB", speculative_config={"method":"ngram"}, speculation_policy="off")
for kw in [dict(), dict(speculation_policy="adaptive"), dict(speculation_policy="static"), dict(num_speculative_tokens=3)]:
    a = llm.get_stats()["num_draft_tokens"]; o = llm.generate(P, G(**kw))[0]
    print("engine off, request", kw, "drafts", llm.get_stats()["num_draft_tokens"]-a, repr(o.outputs[0].text))
llm.engine.set_speculation_policy("static", 2)
a = llm.get_stats()["num_draft_tokens"]; o = llm.generate(P, G())[0]
print("after set static:2 drafts", llm.get_stats()["num_draft_tokens"]-a)
s = llm.get_stats(); print({k:v for k,v in s.items() if k.startswith("spec")})
