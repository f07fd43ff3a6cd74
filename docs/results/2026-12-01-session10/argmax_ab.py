"""A/B in one engine: decode steps with torch.argmax vs the argmax kernel, alternating.
Run: .venv/bin/python docs/results/2026-12-01-session10/argmax_ab.py 1,32,64  (~1 min)"""
import sys, time, statistics
from specserve.llm import LLM
from specserve.bench.offline import make_prompts
from specserve.sampling_params import SamplingParams
from specserve.sample import sampler, rejection_sampler, argmax as am
llm = LLM()
engine = llm.engine
for conc in map(int, sys.argv[1].split(",")):
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=10_000, ignore_eos=True)).request_id
           for p in make_prompts(llm.get_tokenizer(), conc, 128)]
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    res = {"torch": [], "kernel": []}
    for rnd in range(14):
        for name, fn in (("torch", lambda x: x.argmax(dim=-1)), ("kernel", am.argmax)):
            sampler.argmax = rejection_sampler.argmax = fn
            engine.step()
            t = time.perf_counter()
            for _ in range(6): engine.step()
            res[name].append((time.perf_counter() - t) / 6 * 1e3)
    for rid in ids: engine.abort_request(rid)
    a, b = statistics.median(res["torch"]), statistics.median(res["kernel"])
    print(f"c{conc}: step ms torch argmax {a:.2f}  kernel {b:.2f}  ratio {a/b:.3f}")
