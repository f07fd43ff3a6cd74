import os, cProfile, pstats, time
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload, warm_up
d = os.path.expanduser("~/.cache/specserve/drafts/s27-eagle")
llm = LLM(speculative_config={"method": "eagle", "model": d}, speculation_policy="adaptive")
e = llm.engine; warm_up(e)
w = prepare_workload(e, "json", cap=64)
run_workload(e, w, 1, 8)  # as the lab does: concurrency 1 first
prop = e.proposer
pr = cProfile.Profile()
orig = prop.propose
def wrapped(*a, **k):
    pr.enable()
    try: return orig(*a, **k)
    finally: pr.disable()
prop.propose = wrapped
s0 = e.get_stats(); t = time.perf_counter()
run = run_workload(e, w, 32, 64)
s1 = e.get_stats()
steps = s1['num_steps'] - s0['num_steps']
print("steps", steps, "draft_time ms/step", (s1['draft_time_s'] - s0['draft_time_s']) / steps * 1e3, "drafts", s1['num_draft_tokens'] - s0['num_draft_tokens'], "tok/s", run['output_tok_s'])
pr.create_stats(); pstats.Stats(pr).sort_stats("tottime").print_stats(14)
