"""adaptive / off and adaptive / the best other policy per point of a sweep.json, as Markdown
tables: the sweep's own verdict (median of per-round ratios) and in how many rounds adaptive
ran slower than off. Usage: .venv/bin/python sweep_ratios.py DIR/sweep.json"""
import json
import sys

from specserve.bench.sweep import summarize_sweep

summary = summarize_sweep(json.load(open(sys.argv[1]))["cells"])
rows: dict[str, dict[int, dict]] = {}
for p in summary["ratios"]:
    rows.setdefault(p["workload"], {})[p["concurrency"]] = p
cs = sorted({c for r in rows.values() for c in r})
head = " | ".join(f"c{c}" for c in cs)
print(f"| adaptive / off (rounds below off) | {head} |\n|---|" + "---|" * len(cs))
for w, r in rows.items():
    print(f"| {w} | " + " | ".join(
        f"{r[c]['vs_off']:.3f} ({r[c]['rounds_below_off']}/{r[c]['rounds']})" for c in cs) + " |")
print(f"\n| adaptive / best other | {head} |\n|---|" + "---|" * len(cs))
for w, r in rows.items():
    print(f"| {w} | " + " | ".join(
        f"{r[c]['vs_best']:.3f} {r[c]['best_other'].replace('batch-threshold:8', 'bt8')}"
        for c in cs) + " |")
