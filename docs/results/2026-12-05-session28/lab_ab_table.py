"""Per-repeat tok/s ratios to vanilla of the lab A/B runs (lab-c32-{base,main}-{1,2})."""
import json, statistics, glob, os, sys
here = os.path.dirname(os.path.abspath(__file__))
rows = {}
for path in sorted(glob.glob(f"{here}/lab-c32-*/results.json")):
    side = os.path.basename(os.path.dirname(path)).split("-")[2]
    d = json.load(open(path))
    pts = {(p["strategy"], p["workload"]): p["runs"] for p in d["points"]}
    for (s, w), runs in pts.items():
        if s == "vanilla":
            continue
        base = pts[("vanilla", w)]
        rows.setdefault((s, w, side), []).extend(a["output_tok_s"] / b["output_tok_s"]
                                                 for a, b in zip(runs, base))
print("strategy        workload side  ratios to vanilla (each repeat)          median")
for (s, w, side), r in sorted(rows.items()):
    print(f"{s:15s} {w:8s} {side:5s} {' '.join(f'{x:.3f}' for x in r):40s} {statistics.median(r):.3f}")
