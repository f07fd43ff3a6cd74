"""The sweep's own noise floor (run from the repo root): where batch-threshold:8 drafted nothing (more
than 8 requests ran at every step), it did exactly the work of `off`; their median per-round ratio
is an A/A test.
Also adaptive / off where adaptive drafted nothing (the same work plus its bookkeeping)."""
import json
import sys

from specserve.bench.report import group_cells, paired_ratio

for path in sys.argv[1:]:
    rows = group_cells(json.load(open(path))["cells"])
    aa, idle = [], []
    for (prop, w, c), row in rows.items():
        off = row["off"]["output_tok_s_runs"]
        if not row["batch-threshold:8"].get("num_draft_tokens"):
            aa.append((f"{prop}/{w}/c{c}", paired_ratio(row["batch-threshold:8"]["output_tok_s_runs"], off)["median"]))
        if not row["adaptive"].get("num_draft_tokens"):
            idle.append((f"{prop}/{w}/c{c}", paired_ratio(row["adaptive"]["output_tok_s_runs"], off)["median"]))
    for name, pairs in (("batch-threshold:8 / off, identical work (points where it drafted nothing)", aa),
                        ("adaptive / off where adaptive drafted nothing", idle)):
        vals = sorted(v for _, v in pairs)
        print(f"{path}: {name}: n={len(vals)} min {vals[0]:.3f} median {vals[len(vals)//2]:.3f} max {vals[-1]:.3f}")
        print("   " + ", ".join(f"{k} {v:.3f}" for k, v in pairs))
