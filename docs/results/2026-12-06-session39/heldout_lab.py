"""The EAGLE head on prose prompts it was trained on and on the ones held out from its training
(the same seeded split train-draft made), concurrency 1: off / static K = 1, 2, 4 / adaptive,
in alternation. Output tok/s and the acceptance of drafted tokens."""
import os, sys
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload
from specserve.bench.workloads import load_workload
from specserve.train.data import split_by_kind, workload_prompts

head = os.path.expanduser(sys.argv[1] if len(sys.argv) > 1 else "~/.cache/specserve/drafts/s39-eagle")
kinds = "prose,json,sql,rag"
_, held = split_by_kind(workload_prompts(kinds), 0.15, 0)  # train-draft's defaults
held_msgs = [p.messages for p in held if p.kind == "prose"]
items = load_workload("prose")
sets = {"held-out": [i for i in items if i.messages in held_msgs],
        "trained-on": [i for i in items if i.messages not in held_msgs]}
print({k: len(v) for k, v in sets.items()}, "prose prompts")
llm = LLM(speculative_config={"method": "eagle", "model": head, "num_speculative_tokens": 4},
          speculation_policy="adaptive", kv_cache_memory=1 << 30)
eng = llm.engine
wls = {k: prepare_workload(eng, "prose", v, cap=64) for k, v in sets.items()}
n = len(sets["held-out"])
run_workload(eng, wls["held-out"], 1, 2)
for rnd in range(2):
    for name, wl in wls.items():
        line = []
        for pol in ("off", 1, 2, 4, "adaptive"):
            if isinstance(pol, int):
                eng.set_speculation_policy("static", pol)
            else:
                eng.set_speculation_policy(pol, 4)
            x = run_workload(eng, wl, 1, n)
            acc = x["acceptance_rate"]
            line.append(f"{pol}: {x['output_tok_s']:.1f}" + (f" (acc {acc:.2f})" if acc else ""))
        print(f"round {rnd} {name:10s} " + " | ".join(line), flush=True)
