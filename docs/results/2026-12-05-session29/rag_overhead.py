"""rag at concurrency C: off vs adaptive on one engine; spec_time per step and where it goes."""
import os, time, collections
from specserve import LLM
from specserve.bench.lab import prepare_workload, proposer_config, run_workload, warm_up
C = int(os.environ.get("C", 64))
llm = LLM(speculative_config=proposer_config("ngram", 4), speculation_policy="adaptive")
e = llm.engine
warm_up(e)
w = prepare_workload(e, "rag")
T = collections.defaultdict(float)
def wrap(obj, name, label):
    f = getattr(obj, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); T[label] += time.perf_counter() - t; return r
    setattr(obj, name, g)
wrap(e, "_propose", "_propose"); wrap(e.spec_policy, "observe_step", "observe_step")
from specserve.spec_decode import ngram
wrap(ngram.NgramIndex, "lookup", "lookup")
wrap(e, "_choose", "_choose")
for r in range(3):
    for pol in ("off", "adaptive"):
        e.set_speculation_policy(pol)
        T.clear()
        s0, n0 = e.stats.spec_time, e.stats.num_steps
        run = run_workload(e, w, C, C, False, reset_prefix_cache=False)
        steps = e.stats.num_steps - n0
        print(f"{pol:8s} c{C} {run['output_tok_s']:7.1f} tok/s  spec {1e3 * (e.stats.spec_time - s0) / steps:.3f} ms/step  step {1e3 * run['step_time_s'] / steps:.2f} ms  steps {steps}  "
              + "  ".join(f"{k} {v / steps * 1e3:.3f}" for k, v in T.items()), flush=True)
