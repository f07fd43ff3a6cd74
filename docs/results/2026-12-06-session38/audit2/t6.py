import json, time, sys, signal
from specserve import LLM, SamplingParams
signal.alarm(170)
def tr(name, f):
    t=time.time()
    try:
        r = f(); print(f"[{name}] OK ({time.time()-t:.1f}s):", r, flush=True)
    except Exception as e:
        import traceback; print(f"[{name}] EXC {type(e).__name__}: {e}", flush=True)
        if not isinstance(e, ValueError): traceback.print_exc()
G = lambda **k: SamplingParams(temperature=0, **k)
base = json.load(open("/tmp/audit2/t3_base_noprefix_chunked_seqs1.json"))["base"]
doc = "Alice went to the market. She bought apples, oranges and pears. " * 20
prompts = ["The capital of France is",
           "def fibonacci(n):\n    if n <= 1:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\ndef factorial(n):",
           doc + "\nQuestion: what did Alice buy? Answer:",
           doc + "\nSummarize the text above in one sentence:",
           '{"name": "Bob", "age": 31, "city": "Paris"}\n{"name": "Eve", "age": 27, "city":']
which = sys.argv[1]
if which == "preempt":
    llm = LLM(dtype="float32", num_blocks=30)
    def f():
        outs = llm.generate(prompts, G(max_tokens=16, ignore_eos=True))
        s = llm.get_stats()
        return [o.outputs[0].token_ids == b[:16] for o,b in zip(outs, base)], s["num_preemptions"], s["kv_blocks_free"], s["kv_blocks_total"], [o.metrics.num_preemptions for o in outs]
    tr("preemption greedy equal", f)
    tr("max_tokens None", lambda: (lambda o: (len(o.outputs[0].token_ids), o.outputs[0].finish_reason))(llm.generate(["Count: 1, 2, 3,"], G(max_tokens=None, ignore_eos=True))[0]))
    tr("prompt too long", lambda: llm.generate([[5]*500], G(max_tokens=4)))
    tr("prompt+max_tokens over ctx", lambda: (lambda o: (len(o.outputs[0].token_ids), o.outputs[0].finish_reason))(llm.generate([[5]*470], G(max_tokens=100, ignore_eos=True))[0]))
    print(llm.get_stats()["kv_blocks_free"])
elif which == "n":
    llm = LLM(dtype="float32", kv_cache_memory="256MiB")
    def f():
        a = llm.get_stats()
        o = llm.generate([prompts[2]], SamplingParams(n=4, temperature=1.0, seed=5, max_tokens=8))[0]
        b = llm.get_stats()
        return len(o.prompt_token_ids), b["num_prompt_tokens"]-a["num_prompt_tokens"], b["prefix_cache_hits"]-a["prefix_cache_hits"], [c.index for c in o.outputs], o.metrics.num_cached_tokens
    tr("n=4 long prompt prefill once", f)
    tr("n=4 again", f)
elif which == "sched":
    for kw in [dict(long_prefill_token_threshold=0), dict(max_num_batched_tokens=4, speculative_config={"method":"ngram"}, speculation_policy="static"), dict(max_num_batched_tokens=8, long_prefill_token_threshold=512)]:
        def f():
            llm = LLM(dtype="float32", kv_cache_memory="64MiB", **kw)
            outs = llm.generate(prompts[:2], G(max_tokens=8, ignore_eos=True))
            return [o.outputs[0].token_ids == b[:8] for o,b in zip(outs, base)], llm.get_stats()["num_steps"]
        tr(str(kw), f)
