import json, time
from specserve import LLM, SamplingParams, StructuredOutputsParams as SO
def tr(name, f):
    try:
        r = f(); print(f"[{name}] OK:", r, flush=True)
    except Exception as e:
        import traceback; print(f"[{name}] EXC {type(e).__name__}: {e}", flush=True)
        if not isinstance(e, ValueError): traceback.print_exc()
llm = LLM(dtype="float32", kv_cache_memory="256MiB", speculative_config={"method":"ngram","num_speculative_tokens":4}, speculation_policy="static")
G = lambda **k: SamplingParams(temperature=0, **k)
schema = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}}, "required": ["city", "population"]}
msgs=[{"role": "user", "content": 'Copy this JSON: {"city": "Paris", "population": 2100000}'}]
tr("readme schema", lambda: llm.chat(msgs, G(max_tokens=64, structured_outputs=SO(json=schema)))[0].outputs[0].text)
tr("json_object", lambda: llm.chat(msgs, G(max_tokens=40, structured_outputs=SO(json_object=True)))[0].outputs[0].text)
tr("regex", lambda: llm.generate(["Phone: "], G(max_tokens=12, structured_outputs=SO(regex=r"\d{3}-\d{4}")))[0].outputs[0].text)
tr("choice", lambda: llm.chat([{"role":"user","content":"Is water wet?"}], G(max_tokens=5, structured_outputs=SO(choice=["yes","no"])))[0].outputs[0].text)
tr("grammar", lambda: llm.generate(["Color:"], G(max_tokens=5, structured_outputs=SO(grammar='root ::= "red" | "blue"')))[0].outputs[0].text)
tr("bad grammar", lambda: llm.generate(["Color:"], G(max_tokens=5, structured_outputs=SO(grammar='root ::= '))))
tr("bad schema", lambda: llm.generate(["x"], G(max_tokens=5, structured_outputs=SO(json={"type":"nonsense"}))))
tr("two fields", lambda: SO(regex="a", choice=["a"]))
tr("so dict", lambda: SamplingParams(structured_outputs={"choice":["a"]}))
tr("so n=2 seeded", lambda: [o.text for o in llm.generate(["Pick:"], SamplingParams(n=2, seed=1, max_tokens=5, structured_outputs=SO(choice=["alpha","beta","gamma"])))[0].outputs])
tr("so max_tokens short", lambda: (lambda o: (o.text, o.finish_reason))(llm.chat(msgs, G(max_tokens=5, structured_outputs=SO(json=schema)))[0].outputs[0]))
s0 = llm.get_stats(); print("jf stats", s0["num_jump_forward_tokens"], s0["num_jump_forward_accepted"])
# per request speculation
P = ['{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7, "h":']
def spec_delta(sp):
    a = llm.get_stats(); o = llm.generate(P, sp)[0]; b = llm.get_stats()
    return o.outputs[0].text, b["num_draft_tokens"]-a["num_draft_tokens"], o.metrics.num_draft_tokens, o.metrics.num_accepted_tokens
tr("spec default", lambda: spec_delta(G(max_tokens=16)))
tr("spec K=0", lambda: spec_delta(G(max_tokens=16, num_speculative_tokens=0)))
tr("spec K=8>engine 4", lambda: spec_delta(G(max_tokens=16, num_speculative_tokens=8)))
tr("spec K=1", lambda: spec_delta(G(max_tokens=16, num_speculative_tokens=1)))
tr("spec policy off", lambda: spec_delta(G(max_tokens=16, speculation_policy="off")))
tr("spec policy adaptive on static engine", lambda: spec_delta(G(max_tokens=16, speculation_policy="adaptive")))
tr("spec seeded sampled", lambda: spec_delta(SamplingParams(temperature=0.8, seed=3, max_tokens=16)))
tr("spec unseeded sampled", lambda: spec_delta(SamplingParams(temperature=0.8, max_tokens=16)))
# logprobs & stop under speculation vs off
def cmp_lp():
    a = llm.generate(P, G(max_tokens=16, logprobs=1))[0].outputs[0]
    b = llm.generate(P, G(max_tokens=16, logprobs=1, num_speculative_tokens=0))[0].outputs[0]
    md = max(abs(a.logprobs[i][t]-b.logprobs[i][t]) for i,t in enumerate(a.token_ids))
    return a.token_ids==b.token_ids, len(a.logprobs), len(a.token_ids), md, a.cumulative_logprob, b.cumulative_logprob
tr("logprobs spec vs off", cmp_lp)
def cmp_stop():
    a = llm.generate(P, G(max_tokens=30, stop=["8"]))[0].outputs[0]
    b = llm.generate(P, G(max_tokens=30, stop=["8"], num_speculative_tokens=0))[0].outputs[0]
    return (a.text, a.token_ids, a.stop_reason), (b.text, b.token_ids, b.stop_reason)
tr("stop spec vs off", cmp_stop)
def seeded():
    sp = SamplingParams(temperature=0.8, seed=11, max_tokens=16)
    a = llm.generate(P, sp)[0].outputs[0].token_ids
    b = llm.generate(P + ["Once upon a time"]*3, sp)[0].outputs[0].token_ids
    return a==b
tr("seed independent of batch (spec engine)", seeded)
s=llm.get_stats(); print({k:s[k] for k in ["num_running","kv_blocks_free","kv_blocks_total"]}, len(llm.engine.requests))
