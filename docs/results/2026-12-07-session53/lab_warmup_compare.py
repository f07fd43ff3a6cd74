"""tok/s of each lab run, per version and round: prose and json at 32 (prose@32 is the first
large point each strategy's engine meets)."""
import json, sys, statistics
from pathlib import Path
root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/lab53")
rows = {}
for d in sorted(root.glob("*-r*")):
    if not (d / "results.json").is_file():
        continue
    version, rnd = d.name.split("-")
    data = json.loads((d / "results.json").read_text())
    for p in data["points"]:
        key = (p["workload"], p["concurrency"], p["strategy"])
        rows.setdefault(key, {}).setdefault(version, []).extend(
            round(r["output_tok_s"], 1) for r in p["runs"])
print(f"{'workload':8} {'c':>3} {'strategy':15} {'old runs (726cf3d)':32} {'new runs (HEAD)':32} old med  new med")
for (w, c, s), v in sorted(rows.items()):
    old, new = v.get("old", []), v.get("new", [])
    print(f"{w:8} {c:>3} {s:15} {str(old):32} {str(new):32} "
          f"{statistics.median(old) if old else '-':>7} {statistics.median(new) if new else '-':>7}")
# adaptive / vanilla per run index, at 32
for version in ("old", "new"):
    for w in ("prose", "json"):
        a = rows.get((w, 32, "adaptive-ngram"), {}).get(version, [])
        b = rows.get((w, 32, "vanilla"), {}).get(version, [])
        if a and b:
            print(f"{version} {w}@32 adaptive/vanilla medians: {statistics.median(a)/statistics.median(b):.3f}")
