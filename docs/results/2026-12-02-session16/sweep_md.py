"""Markdown table of a sweep.json (run from the repo root): tok/s per policy (median run), adaptive's
median per-round ratios to the best other policy and to off, and the steps where it drafted."""
import json
import sys

from specserve.bench.sweep import summarize_sweep
from specserve.bench.report import group_cells

cells = json.load(open(sys.argv[1]))["cells"]
ratios = {(r["workload"], r["concurrency"]): r for r in summarize_sweep(cells)["ratios"]}
pols = ["off", "static:2", "static:4", "batch-threshold:8", "adaptive"]
print("| workload | conc | " + " | ".join(pols) + " | adaptive/best | adaptive/off | adaptive: request-steps with K>0 | spec time / step |")
print("|---|---:|" + "---:|" * (len(pols) + 4))
for (prop, w, c), row in group_cells(cells).items():
    r = ratios[(w, c)]
    a = row["adaptive"]
    hist = a.get("spec_k_histogram") or {}
    drafted = sum(v for k, v in hist.items() if k != "0")
    frac = r.get("spec_time_frac")
    flag = lambda x, lim: f"**{x:.3f}**" if x < lim else f"{x:.3f}"
    print(f"| {w} | {c} | " + " | ".join(f"{row[p]['output_tok_s']:.1f}" for p in pols)
          + f" | {flag(r['vs_best'], 0.97)} ({r['best_other']}) | {flag(r['vs_off'], 1.0)} | {drafted}/{sum(hist.values())}"
          + f" | {'—' if frac is None else f'{frac:.2%}'} |")
