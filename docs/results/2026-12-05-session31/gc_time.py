import gc, time, sys, os
from specserve import LLM
from specserve.bench.offline import make_prompts, bench_engine
llm = LLM()
if os.environ.get("FREEZE"):
    gc.collect(); gc.freeze()
c = int(sys.argv[1]) if len(sys.argv) > 1 else 64
prompts = make_prompts(llm.get_tokenizer(), c, 128)
st = {"t": 0.0, "n": [0, 0, 0], "t0": 0.0, "tg": [0.0, 0.0, 0.0]}
def cb(phase, info):
    if phase == "start":
        st["t0"] = time.perf_counter()
    else:
        dt = time.perf_counter() - st["t0"]; st["t"] += dt; st["n"][info["generation"]] += 1; st["tg"][info["generation"]] += dt
gc.callbacks.append(cb)
print("tracked objects", len(gc.get_objects()), "frozen", gc.get_freeze_count())
for rep in range(3):
    st["t"] = 0.0; st["n"] = [0, 0, 0]; st["tg"] = [0.0, 0.0, 0.0]
    llm.engine.block_manager.reset_prefix_cache()
    r = bench_engine(llm, prompts, 128)
    print(f"tok/s {r.output_tok_s:.1f} wall {r.wall_s:.2f}s gc {st['t']*1e3:.1f} ms collections {st['n']} per-gen ms {[round(x*1e3,1) for x in st['tg']]}")
