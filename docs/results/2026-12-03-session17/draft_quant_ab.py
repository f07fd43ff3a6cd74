"""In-situ draft forward time and throughput: trained 3-layer draft, static K=2, json, c1, with the
draft's weights bf16 / int8 / int4, rotated rounds in one process each (separate engines)."""
import os, sys, statistics
from specserve.bench.lab import build_llm, prepare_workload, proposer_config, run_workload, warm_up
DRAFT = os.path.expanduser("~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-3")
c = int(sys.argv[1]) if len(sys.argv) > 1 else 1
quants = sys.argv[2].split(",") if len(sys.argv) > 2 else ["none", "int8", "int4"]
engines = {}
for q in quants:
    cfg = proposer_config("draft", 2, draft_model=DRAFT)
    if q != "none":
        cfg["quantization"] = q
    llm = build_llm(None, {"speculative_config": cfg, "speculation_policy": "static",
                           "kv_cache_memory": "1GiB"})
    warm_up(llm.engine)
    engines[q] = llm.engine
work = prepare_workload(next(iter(engines.values())), "json", cap=32)
res = {q: [] for q in quants}
for r in range(4):
    for q in quants[r % len(quants):] + quants[:r % len(quants)]:
        e = engines[q]; p = e.proposer
        t0, f0 = p.time, p.num_forwards
        out = run_workload(e, work, c, 8, False, warm_shared_prefix=True)
        res[q].append((out["output_tok_s"], (p.time - t0) / (p.num_forwards - f0) * 1e3,
                       out["acceptance_rate"], out["forward_time_s"] / out["num_steps"] * 1e3))
for q in quants:
    tp, ms, acc, fw = zip(*res[q])
    print(f"{q:5} tok/s {statistics.median(tp):6.1f} draft ms/forward {statistics.median(ms):.2f} "
          f"target ms/step {statistics.median(fw):.2f} acceptance {statistics.median(acc):.3f}")
