import time, sys
from specserve import LLM, SamplingParams
G = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
P = ["The capital of France is", "def fibonacci(n):"]
modes = [dict(), dict(quantization="int8"), dict(quantization="int4"), dict(quantization="gguf"), dict(quantization="fp8"),
         dict(kv_cache_dtype="int8"), dict(kv_cache_dtype="fp8_e4m3"), dict(dtype="float32", quantization="int8"), dict(dtype="float32", kv_cache_dtype="fp8_e4m3")]
sel = [modes[int(i)] for i in sys.argv[1:]] if sys.argv[1:] else modes
for m in sel:
    t=time.time()
    try:
        llm = LLM(kv_cache_memory="128MiB", **m)
        t1=time.time()
        outs = llm.generate(P, G)
        s = llm.get_stats()
        print(m, f"load {t1-t:.1f}s gen {time.time()-t1:.1f}s", s["weight_bytes"]>>20, "MiB", s["kv_blocks_total"], s["kv_cache_dtype"], [o.outputs[0].text for o in outs], flush=True)
    except Exception as e:
        import traceback; traceback.print_exc()
    del llm
