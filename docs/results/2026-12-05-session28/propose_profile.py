import cProfile, pstats
from specserve import LLM
from specserve.bench.lab import prepare_workload, proposer_config, run_workload, warm_up
llm = LLM(speculative_config=proposer_config("ngram", 4), speculation_policy="adaptive")
e = llm.engine; warm_up(e)
w = prepare_workload(e, "prose", cap=32)
run_workload(e, w, 4, 32)
pr = cProfile.Profile()
orig = e._propose
def wrapped(*a, **k):
    pr.enable()
    try: return orig(*a, **k)
    finally: pr.disable()
e._propose = wrapped
n0 = e.stats.num_steps
run_workload(e, w, 4, 64)
print("steps", e.stats.num_steps - n0)
pstats.Stats(pr).sort_stats("cumulative").print_stats(18)
