"""Per-repeat tok/s of each lab strategy over vanilla's in the same repeat (bench lab runs the
strategies one engine after another, so repeat r of each shares the machine's speed less well
than a sweep's rounds do), with the drafted tokens and acceptance. Usage: lab_ratios.py results.json"""
import json, statistics, sys

d = json.load(open(sys.argv[1]))
cells = {(p["strategy"], p["workload"], p["concurrency"]): p["runs"] for p in d["points"]}
for (s, w, c), runs in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
    base = cells[("vanilla", w, c)]
    ratios = [r["output_tok_s"] / b["output_tok_s"] for r, b in zip(runs, base)]
    drafted = sum(r.get("num_draft_tokens", 0) for r in runs)
    accepted = sum(r.get("num_accepted_tokens", 0) for r in runs)
    print(f"{w:5s} c{c:<3d} {s:15s} tok/s {[round(r['output_tok_s'], 1) for r in runs]}  "
          f"over vanilla {[round(x, 3) for x in ratios]} median {statistics.median(ratios):.3f}  "
          f"drafted {drafted} accepted {accepted / max(drafted, 1):.2f}")
