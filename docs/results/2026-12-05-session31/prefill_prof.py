"""Where a 2,048-token prefill step (16 prompts x 128) goes: torch profiler, self times."""
import time, sys
from torch.profiler import ProfilerActivity, profile
from specserve import LLM, SamplingParams
from specserve.bench.offline import make_prompts
from specserve.bench.step_profile import _visible_kernel
llm = LLM()
eng = llm.engine
tok = llm.get_tokenizer()
params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
def one(prof_it, seed):
    prompts = make_prompts(tok, 16 + seed, 128)[seed:]
    eng.block_manager.reset_prefix_cache()
    for p in prompts:
        eng.add_request(p, params)
    t = time.perf_counter()
    if prof_it:
        with _visible_kernel(), profile(activities=[ProfilerActivity.CPU]) as prof:
            eng.step()
    else:
        eng.step()
    dt = time.perf_counter() - t
    while eng.has_unfinished_requests():
        eng.step()
    return dt, (prof if prof_it else None)
for i in range(4):
    print("step ms", round(one(False, i)[0] * 1e3, 1))
dt, prof = one(True, 5)
print("profiled step ms", round(dt * 1e3, 1))
ops = sorted(((e.key, (e.cpu_time_total if e.key.startswith("specserve::") else e.self_cpu_time_total) / 1e3, e.count) for e in prof.key_averages()), key=lambda x: -x[1])
for k, v, c in ops[:25]:
    print(f"{v:9.2f} ms {c:5d}  {k}")
