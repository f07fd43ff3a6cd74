import time, traceback
from specserve import LLM, SamplingParams, StructuredOutputsParams
llm = LLM(dtype="float32", kv_cache_memory="256MiB")
def tr(name, f):
    try:
        r = f(); print(f"[{name}] OK:", r)
    except Exception as e:
        print(f"[{name}] EXC {type(e).__name__}: {e}")
G = lambda **k: SamplingParams(temperature=0, **k)
# prompt dicts
ids = llm.get_tokenizer().encode("The capital of France is")
tr("dict prompt", lambda: [o.outputs[0].text for o in llm.generate([{"prompt":"The capital of France is"},{"prompt_token_ids":ids}, ids], G(max_tokens=6))])
tr("single token list", lambda: [o.outputs[0].text for o in llm.generate(ids, G(max_tokens=6))])
tr("empty list", lambda: llm.generate([], G(max_tokens=4)))
tr("empty prompt", lambda: llm.generate([""], G(max_tokens=4)))
tr("empty dict", lambda: llm.generate([{}], G(max_tokens=4)))
tr("bad dict key", lambda: llm.generate([{"prompt":"x","multi_modal_data":{}}], G(max_tokens=4)))
tr("oov token", lambda: llm.generate([[10**6]], G(max_tokens=4)))
tr("neg token", lambda: llm.generate([[-1]], G(max_tokens=4)))
tr("prompt_token_ids tensor-ish str", lambda: llm.generate([{"prompt_token_ids":"abc"}], G(max_tokens=4)))
tr("params list mismatch", lambda: llm.generate(["a","b"], [G(max_tokens=2)]))
# n and seeds
def nseed():
    sp = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8)
    a = llm.generate(["Once upon a time"], sp)[0]
    b = llm.generate(["Once upon a time", "Hello there"], sp)[0]
    return [o.text for o in a.outputs], [o.index for o in a.outputs], [o.text for o in a.outputs]==[o.text for o in b.outputs]
tr("n seeds", nseed)
tr("n greedy", lambda: [o.text for o in llm.generate(["Once upon a time"], G(n=2, max_tokens=6))[0].outputs])
tr("n=2 unseeded", lambda: [o.text for o in llm.generate(["Once upon a time"], SamplingParams(n=2, max_tokens=6))[0].outputs])
# logprobs
def lp():
    o = llm.generate(["The capital of France is"], G(max_tokens=3, logprobs=2))[0].outputs[0]
    return o.token_ids, o.cumulative_logprob, o.logprobs
tr("logprobs", lp)
tr("logprobs0", lambda: llm.generate(["The capital of France is"], G(max_tokens=2, logprobs=0))[0].outputs[0].logprobs)
tr("logprobs str", lambda: SamplingParams(logprobs="2"))
tr("logprobs 21", lambda: SamplingParams(logprobs=21))
# stop
def stop():
    r=[]
    for kw in [dict(stop=["."]), dict(stop=["."], include_stop_str_in_output=True), dict(stop=" Paris"), dict(stop_token_ids=[30])]:
        o = llm.generate(["The capital of France is"], G(max_tokens=16, **kw))[0].outputs[0]
        r.append((kw, o.text, o.finish_reason, o.stop_reason, o.token_ids))
    return r
tr("stop", stop)
tr("min_tokens ignore_eos", lambda: [(len(o.outputs[0].token_ids), o.outputs[0].finish_reason) for o in llm.generate(["Hi"], G(max_tokens=5, min_tokens=5, ignore_eos=True))])
tr("max_tokens None", lambda: SamplingParams(max_tokens=None))
tr("logit_bias", lambda: llm.generate(["The capital of France is"], G(max_tokens=4, logit_bias={28:100.0}))[0].outputs[0].token_ids)
tr("logit_bias oov", lambda: llm.generate(["x"], G(max_tokens=4, logit_bias={10**6:1.0})))
# chat
msgs=[{"role":"user","content":"Say hi"}]
tr("chat", lambda: llm.chat(msgs, G(max_tokens=8))[0].outputs[0].text)
tr("chat batch", lambda: [o.outputs[0].text for o in llm.chat([msgs, [{"role":"user","content":"Say bye"}]], G(max_tokens=8))])
tr("chat continue", lambda: llm.chat(msgs+[{"role":"assistant","content":"Hello! I am"}], G(max_tokens=8), continue_final_message=True, add_generation_prompt=False)[0])
tr("chat continue+agp", lambda: llm.chat(msgs+[{"role":"assistant","content":"Hello! I am"}], G(max_tokens=8), continue_final_message=True)[0].outputs[0].text)
tr("chat no gen prompt", lambda: llm.chat(msgs, G(max_tokens=8), add_generation_prompt=False)[0].outputs[0].text)
tr("chat kwargs", lambda: llm.chat(msgs, G(max_tokens=8), chat_template_kwargs={"foo":1})[0].outputs[0].text)
tr("chat system", lambda: llm.chat([{"role":"system","content":"You are a pirate"}]+msgs, G(max_tokens=8))[0].outputs[0].text)
tr("chat developer", lambda: llm.chat([{"role":"developer","content":"You are a pirate"}]+msgs, G(max_tokens=8))[0].prompt)
tr("chat empty", lambda: llm.chat([], G(max_tokens=8)))
tr("chat bad role", lambda: llm.chat([{"role":"bogus","content":"x"}], G(max_tokens=4)))
tr("chat missing content", lambda: llm.chat([{"role":"user"}], G(max_tokens=4)))
tr("chat list content", lambda: llm.chat([{"role":"user","content":[{"type":"text","text":"hi"}]}], G(max_tokens=4))[0].outputs[0].text)
# stream
def stream():
    texts=[]
    for out in llm.generate_stream("Once upon a time", G(max_tokens=6)):
        texts.append((out.outputs[0].text, out.finished))
    return texts
tr("stream", stream)
tr("stream n=2", lambda: list(llm.generate_stream("Once", SamplingParams(n=2, max_tokens=3))))
tr("stream dict", lambda: [o.outputs[0].text for o in llm.generate_stream({"prompt":"Once"}, G(max_tokens=3))][-1])
def stream_break():
    for i,out in enumerate(llm.generate_stream("Once upon a time", G(max_tokens=30))):
        if i==2: break
    import gc; gc.collect()
    s=llm.get_stats(); return s["num_running"], s["kv_blocks_free"], s["kv_blocks_total"], len(llm.engine.requests)
tr("stream break", stream_break)
def stream_stop():
    return [(o.outputs[0].text,o.finished) for o in llm.generate_stream("The capital of France is", G(max_tokens=16, stop=["."]))]
tr("stream stop", stream_stop)
s=llm.get_stats(); print("final stats", {k:s[k] for k in ["num_running","num_waiting","kv_blocks_free","kv_blocks_total"]}, len(llm.engine.requests))
print("has set_speculation_policy:", hasattr(llm, "set_speculation_policy"))
