"""Per run of a lab results.json: tok/s, steps, drafts, accepted, forward / step / draft seconds,
the K histogram, and for adaptive-eagle at concurrency 1 the prices the policy held at the
run's end (cost_model_ms). Usage: python lab_steps.py DIR/results.json"""
import json
import sys

d = json.load(open(sys.argv[1]))
for p in d["points"]:
    for r in p["runs"]:
        print(f"{p['strategy']:14s} {p['workload']:5s} c{p['concurrency']:<3d} "
              f"{r['output_tok_s']:6.1f} tok/s steps {r['num_steps']} drafts {r['num_draft_tokens']} "
              f"accepted {r['num_accepted_tokens']} fwd {r['forward_time_s']:.1f}s "
              f"step {r['step_time_s']:.1f}s draft {r['draft_time_s']:.2f}s K {r['spec_k_histogram']}")
for p in d["points"]:
    if p["strategy"] == "adaptive-eagle" and p["concurrency"] == 1:
        for r in p["runs"]:
            cm = r.get("cost_model_ms") or {}
            print(p["workload"], "drafts", r["num_draft_tokens"], "target ms",
                  {n: cm.get("target", {}).get(n) for n in ("1", "2", "4", "8")},
                  "draft ms", {n: cm.get("draft", {}).get(n) for n in ("1", "2", "4")})
