"""Does a fresh adaptive-EAGLE engine ever decide never to draft at c1 (lab repeat 2 of session 31)?
Prints its start-up profile and the c1 prose run's drafts."""
import os, time
from specserve.bench.lab import builtin_strategies, build_llm, prepare_workload, run_workload, warm_up
s = builtin_strategies(eagle_model=os.path.expanduser("~/.cache/specserve/drafts/s27-eagle"))["adaptive-eagle"]
llm = build_llm(None, {"max_num_seqs": 128, **s.engine_kwargs})
warm_up(llm.engine)
t, d = llm.engine._cost_models
print("profile s", round(llm.engine.profile_time, 2), "target ms", {int(x): round(t(x) * 1e3, 2) for x in (1, 2, 3, 4, 5, 8)},
      "draft ms", {int(x): round(d(x) * 1e3, 2) for x in (1, 2, 4)}, "draft chunk 64", round(d.chunk(64) * 1e3, 2), flush=True)
wl = prepare_workload(llm.engine, "prose", cap=64)
for rep in range(2):
    out = run_workload(llm.engine, wl, 1, 8, False, False)
    print(f"run {rep}: tok/s {out['output_tok_s']:.1f} drafts {out['num_draft_tokens']} K mean {out['spec_k_mean']:.2f} accept {out['acceptance_rate']}", flush=True)
