"""Where one trained-draft forward's time goes as served (static K=2, greedy, json): the
proposer's whole propose() against its runner's prepare / forward / logits, per forward, beside
the target's verification forward (steps without prefill: every sequence runs its 1 + K tokens),
at concurrency 1, 8 and 32.
python draft_breakdown.py [CONCURRENCIES] [none|int8|int4] [DRAFT_DIR]"""
import os
import statistics
import sys
import time

import specserve.spec_decode.draft_model as dm
from specserve.bench.lab import build_llm, prepare_workload, proposer_config, run_workload, warm_up

concs = [int(c) for c in (sys.argv[1] if len(sys.argv) > 1 else "1,8,32").split(",")]
quant = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "none" else None
DRAFT = os.path.expanduser(sys.argv[3] if len(sys.argv) > 3 else
                           "~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-3")
cfg = proposer_config("draft", 2, draft_model=DRAFT)
if quant:
    cfg["quantization"] = quant
llm = build_llm(None, {"speculative_config": cfg, "speculation_policy": "static",
                       "kv_cache_memory": "2GiB"})
e = llm.engine
p = e.proposer
warm_up(e)
acc: dict[str, float] = {}


def timed(name, fn):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        r = fn(*a, **k)
        acc[name] = acc.get(name, 0.0) + time.perf_counter() - t0
        return r
    return wrapper


verify: list[float] = []
target_execute = e.runner.execute


def timed_target(inputs, *a, **k):
    t0 = time.perf_counter()
    r = target_execute(inputs, *a, **k)
    if len(inputs.input_ids) <= 3 * len(inputs.query_start):  # no prefill chunk in the step
        verify.append(time.perf_counter() - t0)
    return r


e.runner.execute = timed_target
runner = p.runner
runner.prepare = timed("prepare", runner.prepare)
runner.model.compute_logits = timed("logits", runner.model.compute_logits)
runner.execute = timed("execute", runner.execute)
dm.draft_tokens = timed("tokens", dm.draft_tokens)
p.block_manager.allocate = timed("allocate", p.block_manager.allocate)
work = prepare_workload(e, "json", cap=32)
for c in concs:
    rows = []
    for _ in range(3):
        acc.clear()
        verify.clear()
        t0, f0 = p.time, p.num_forwards
        out = run_workload(e, work, c, max(8, 2 * c), False, warm_shared_prefix=True)
        nf = p.num_forwards - f0
        per = {k: v / nf * 1e3 for k, v in acc.items()}
        rows.append(((p.time - t0) / nf * 1e3, per, statistics.median(verify) * 1e3,
                     out["acceptance_rate"]))
    tot = statistics.median(r[0] for r in rows)
    tgt = statistics.median(r[2] for r in rows)
    accept = statistics.median(r[3] for r in rows)
    parts = {k: statistics.median(r[1].get(k, 0) for r in rows) for k in acc}
    print(f"c{c:<3} draft ms/forward {tot:.2f} (prepare {parts['prepare']:.2f}, execute "
          f"{parts['execute'] - parts['logits']:.2f} + logits {parts['logits']:.2f}, tokens "
          f"{parts['tokens']:.2f}, allocate {parts['allocate']:.2f}) target ms/verification "
          f"{tgt:.2f} ratio {tot / tgt:.3f} acceptance {accept:.3f}", flush=True)
