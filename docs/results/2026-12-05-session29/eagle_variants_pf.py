import os, sys, time, resource
from specserve import LLM, SamplingParams
from specserve.bench.offline import make_prompts
d = os.path.expanduser("~/.cache/specserve/drafts/s27-eagle")
kw = {} if sys.argv[1] == "vanilla" else dict(speculative_config={"method": "eagle", "model": d}, speculation_policy="adaptive")
llm = LLM(**kw); e = llm.engine
if sys.argv[1] == "noaux":
    e.runner.aux_layers = (); e.proposer.needs_hidden = False
if sys.argv[1] == "nohand":
    e.proposer.needs_hidden = False
for p in make_prompts(llm.get_tokenizer(), 32, 192): e.add_request(p, SamplingParams(temperature=0, max_tokens=10000, ignore_eos=True))
for _ in range(20): e.step()
r0 = resource.getrusage(resource.RUSAGE_SELF); t = time.perf_counter()
for _ in range(100): e.step()
w = (time.perf_counter() - t) / 100 * 1e3; r1 = resource.getrusage(resource.RUSAGE_SELF)
print(f"{sys.argv[1]:8s} step {w:.2f} ms  minor faults/step {(r1.ru_minflt - r0.ru_minflt)/100:.0f}  user+sys/step {((r1.ru_utime+r1.ru_stime)-(r0.ru_utime+r0.ru_stime))/100*1e3:.1f} ms")
