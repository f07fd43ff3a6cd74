"""What a loaded EAGLE head costs a step when it drafts nothing: prose at 32, no proposer vs the
head under `off` vs the head under adaptive, on the same engine build order, runs alternated."""
import os, gc
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload
head = os.path.expanduser("~/.cache/specserve/drafts/s39-eagle")
c = 32
engines = {}
for name, kw in (("none", {}), ("head", {"speculative_config": {"method": "eagle", "model": head, "num_speculative_tokens": 4}, "speculation_policy": "adaptive"})):
    engines[name] = LLM(kv_cache_memory=1 << 30, max_num_seqs=128, **kw).engine
wl = prepare_workload(engines["none"], "prose", cap=32)
for e in engines.values():
    run_workload(e, wl, c, 2 * c)
pols = {}
eh = engines["head"]
for p in ("off", "adaptive"):
    eh.set_speculation_policy(p, 4); pols[p] = eh.spec_policy
for r in range(4):
    out = []
    for label, e, pol in (("none", engines["none"], None), ("head/off", eh, "off"), ("head/adaptive", eh, "adaptive")):
        if pol: e.spec_policy = pols[pol]
        x = run_workload(e, wl, c, 2 * c)
        n = x["num_steps"]
        out.append(f"{label}: {x['output_tok_s']:.0f} tok/s fwd {1e3*x['forward_time_s']/n:.2f} spec {1e3*x['spec_time_s']/n:.2f} other {1e3*(x['step_time_s']-x['forward_time_s']-x['spec_time_s'])/n:.2f} ms/step d{x['num_draft_tokens']}")
    print(f"round {r}: " + " | ".join(out), flush=True)
