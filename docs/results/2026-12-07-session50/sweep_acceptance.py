"""Per proposer, workload and concurrency: the median run's acceptance, tokens per step and
drafted tokens under static:4 and adaptive, from a `bench sweep` JSON. The runs are greedy, so
the static:4 rows depend on the proposer, not on the machine's speed; adaptive's choice of K
does depend on it (its cost model is refit from measured step times).

  python docs/results/2026-12-07-session50/sweep_acceptance.py DIR/sweep.json
"""
import json
import sys

d = json.load(open(sys.argv[1]))
print("proposer workload conc policy | acceptance | tokens/step | drafted | accepted | output tok")
for c in d["cells"]:
    if c["policy"] == "off":
        continue
    r = c["run"]
    print(f"{c['proposer']:7s} {c['workload']:6s} c{c['concurrency']:<3d} {c['policy']:9s} | "
          f"{r['acceptance_rate'] or 0:.3f} | {r['num_generated_tokens'] / r['num_steps']:.2f} | "
          f"{r['num_draft_tokens']} | {r['num_accepted_tokens']} | {r['output_tokens']}")
