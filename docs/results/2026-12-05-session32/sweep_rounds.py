"""Per-round throughput of `off` and `adaptive` in a sweep.json, and adaptive / off per round
(runs of one round share the machine's speed of the moment).
Usage: python sweep_rounds.py DIR/sweep.json"""
import json
import sys

d = json.load(open(sys.argv[1]))
runs = {(c["proposer"], c["workload"], c["concurrency"], c["policy"]): c["run"] for c in d["cells"]}
for (prop, w, conc, pol), run in sorted(runs.items()):
    if pol != "adaptive":
        continue
    off = runs[(prop, w, conc, "off")]["output_tok_s_runs"]
    ad = run["output_tok_s_runs"]
    print(f"{prop} {w:6s} c{conc:<3d} off {[round(x, 1) for x in off]} adaptive "
          f"{[round(x, 1) for x in ad]} per round {[round(a / b, 3) for a, b in zip(ad, off)]}")
