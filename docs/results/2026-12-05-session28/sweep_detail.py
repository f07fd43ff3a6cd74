"""Per cell of a sweep.json: adaptive's K mean, acceptance, predicted-vs-actual step error and
speculation bookkeeping share, next to off's and adaptive's output tok/s (medians of repeats
as the sweep reports them; the 'run' shown is the median run)."""
import json, sys
d = json.load(open(sys.argv[1]))
cells = {(c["workload"], c["concurrency"], c["policy"]): c["run"] for c in d["cells"]}
print("workload conc  off tok/s  adaptive tok/s  ratio  K mean  accept  step err  spec share  steps off/adapt")
for (w, conc, pol), r in sorted(cells.items()):
    if pol != "adaptive":
        continue
    off = cells[(w, conc, "off")]
    acc = r["acceptance_rate"]
    err = r["spec_step_time_rel_error"]
    print(f"{w:8s} {conc:4d} {off['output_tok_s']:9.1f} {r['output_tok_s']:14.1f} "
          f"{r['output_tok_s'] / off['output_tok_s']:6.3f} {r['spec_k_mean']:7.2f} "
          f"{acc if acc is None else round(acc, 2)!s:>7} {err if err is None else round(err, 3)!s:>9} "
          f"{r['spec_time_s'] / r['step_time_s']:10.3%} {off['num_steps']:6d}/{r['num_steps']}")
