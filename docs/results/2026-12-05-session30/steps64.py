"""Per-step times of bench offline's c64 128/128 run, grouped by scheduled token count."""
import time, sys
from specserve import LLM
from specserve.bench.offline import make_prompts, bench_engine
llm = LLM()
c = int(sys.argv[1]) if len(sys.argv) > 1 else 64
prompts = make_prompts(llm.get_tokenizer(), c, 128)
eng = llm.engine
ex = eng.runner.execute
log = []
def timed(inputs, *a, **k):
    t = time.perf_counter(); r = ex(inputs, *a, **k); log.append((inputs.input_ids.numel(), time.perf_counter() - t)); return r
eng.runner.execute = timed
st = eng.step
steps = []
def tstep(*a, **k):
    t = time.perf_counter(); r = st(*a, **k); steps.append(time.perf_counter() - t); return r
eng.step = tstep
for rep in range(2):
    log.clear(); steps.clear()
    eng.block_manager.reset_prefix_cache()
    r = bench_engine(llm, prompts, 128)
    print(f"tok/s {r.output_tok_s:.1f} wall {r.wall_s:.2f}s steps {len(steps)} sum(step) {sum(steps):.2f}s sum(execute) {sum(t for _, t in log):.2f}s")
    big = [(n, t) for n, t in log if n > c]
    print(f"  prefill-ish steps {len(big)}: tokens {[n for n,_ in big]} ms {[round(t*1e3) for _,t in big]}")
    dec = [t for n, t in log if n <= c]
    print(f"  decode steps {len(dec)}: sum {sum(dec):.2f}s mean {sum(dec)/len(dec)*1e3:.1f} ms; step overhead {sum(steps)-sum(t for _,t in log):.2f}s")
