"""Where a steady decode step goes outside the model forward: 32 (or C) sequences decoding,
engine.step() timed against the runner's forward, then cProfile of the same steps.
python docs/results/2026-12-04-session22/step_split.py [C] [STEPS]"""
import cProfile, pstats, sys, time
from specserve import LLM, SamplingParams

C = int(sys.argv[1]) if len(sys.argv) > 1 else 32
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 60
llm = LLM()
eng = llm.engine
tok = llm.get_tokenizer()
for i in range(C):
    ids = tok(f"Request {i}: write a long story about a lighthouse keeper named {i}.").input_ids
    eng.add_request(ids * 4, SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
while any(r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.running) or eng.scheduler.waiting:
    eng.step()
for _ in range(5):
    eng.step()
s0 = eng.get_stats(); t0 = time.perf_counter()
for _ in range(STEPS):
    eng.step()
wall = time.perf_counter() - t0; s1 = eng.get_stats()
fwd = s1["forward_time_s"] - s0["forward_time_s"]
print(f"c{C}: step {wall / STEPS * 1e3:.2f} ms, forward {fwd / STEPS * 1e3:.2f} ms, "
      f"outside the forward {(wall - fwd) / STEPS * 1e3:.2f} ms")
prof = cProfile.Profile()
prof.enable()
for _ in range(STEPS):
    eng.step()
prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(22)
