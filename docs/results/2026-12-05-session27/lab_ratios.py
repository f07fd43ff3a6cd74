import json, sys, statistics
d = json.load(open(sys.argv[1]))
pts = {(p["strategy"], p["workload"], p["concurrency"]): p["runs"] for p in d["points"]}
for (s, w, c), runs in sorted(pts.items()):
    if s == "vanilla": continue
    base = pts[("vanilla", w, c)]
    key = "output_tok_s"
    if c == 1:
        # per-stream tok/s at c1 = output_tok_s
        pass
    r = [a[key] / b[key] for a, b in zip(runs, base)]
    tp = [b["tpot_p50_ms"] / a["tpot_p50_ms"] for a, b in zip(runs, base)]
    print(f"{s:15s} {w:5s} c{c:<3d} tok/s ratio per repeat {[round(x, 3) for x in r]} median {statistics.median(r):.3f} | TPOT speedup {[round(x, 2) for x in tp]}")
