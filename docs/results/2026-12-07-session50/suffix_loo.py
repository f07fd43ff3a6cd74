"""Suffix decoding against prompt lookup on a warm server, leave-one-out.

The suffix engine first serves every prompt of a workload (no speculation), so its cache
holds the workload's replies; so does the n-gram engine (its prefix cache then holds the
prompts too). Then each measured prompt runs alone (concurrency 1, static K = 4) with its own
prompt's replies hidden (`exclude_same_prompt`), beside the n-gram engine with and without
speculation, in turn per prompt. The measured runs add no replies: every prompt is guessed from
the same cache, one reply per other prompt. Greedy, bf16, 64-token cap, no jump-forward
drafts (the json workload's grammar still applies).

Run from the repo root:
  HF_HUB_OFFLINE=1 .venv/bin/python docs/results/2026-12-07-session50/suffix_loo.py
"""
import os
import statistics
import time
from dataclasses import replace

from specserve import LLM
from specserve.bench.lab import prepare_workload, warm_up
from specserve.bench.workloads import load_workload

MEASURED = int(os.environ.get("MEASURED", "24"))
CAP = 64
WORKLOADS = os.environ.get("WORKLOADS", "prose,json,sql,rag").split(",")


def run_one(engine, prompt, params) -> tuple[float, object]:
    t0 = time.perf_counter()
    engine.add_request(prompt, params)
    out = None
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                out = o
    return time.perf_counter() - t0, out


def main() -> None:
    common = dict(dtype="bfloat16", jump_forward_tokens=0, speculation_policy="static")
    suffix = LLM(speculative_config={"method": "suffix", "num_speculative_tokens": 4}, **common)
    ngram = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4}, **common)
    for llm in (suffix, ngram):
        warm_up(llm.engine)
    print(f"leave-one-out, c1, static K=4, {MEASURED} prompts per workload, cap {CAP} tokens")
    print("workload | method | acceptance | tokens/step | tok/s ratio to off: median [quartiles]")
    for name in WORKLOADS:
        items = load_workload(name)
        proposer = suffix.engine.proposer
        proposer.replies.clear()
        proposer.exclude_same_prompt = True
        wl = prepare_workload(suffix.engine, name, items, cap=CAP)
        # Warm: every prompt once, no speculation, on both engines (the n-gram engine's prefix
        # cache then holds the prompts as the suffix engine's does).
        for engine in (suffix.engine, ngram.engine):
            for i in range(len(wl.prompts)):
                engine.add_request(wl.prompts[i], replace(wl.params(i), speculation_policy="off"))
            while engine.has_unfinished_requests():
                engine.step()
        print(f"{name}: {proposer.replies.num_replies} replies cached, "
              f"{len(proposer.replies.tokens)} tokens")
        add = proposer.replies.add
        proposer.replies.add = lambda reply, key=None: None  # frozen while measuring
        sides = {"suffix": (suffix, "static"), "ngram": (ngram, "static"),
                 "off": (ngram, "off")}
        rec: dict[str, list] = {s: [] for s in sides}
        for i in range(MEASURED):
            order = list(sides) if i % 2 == 0 else list(sides)[::-1]
            for side in order:
                llm, policy = sides[side]
                params = replace(wl.params(i), speculation_policy=policy)
                wall, out = run_one(llm.engine, wl.prompts[i], params)
                n = len(out.outputs[0].token_ids)
                rec[side].append((wall, n, out.metrics.num_draft_tokens,
                                  out.metrics.num_accepted_tokens))
        for side in ("suffix", "ngram"):
            drafted = sum(r[2] for r in rec[side])
            accepted = sum(r[3] for r in rec[side])
            tokens = sum(r[1] for r in rec[side])
            ratios = sorted((o[0] / o[1]) / (r[0] / r[1]) * 1.0
                            for r, o in zip(rec[side], rec["off"], strict=True))
            q = statistics.quantiles(ratios, n=4)
            print(f"{name} | {side} | {accepted / max(drafted, 1):.3f} "
                  f"| {tokens / (tokens - accepted):.2f} "
                  f"| {statistics.median(ratios):.3f} [{q[0]:.3f}, {q[2]:.3f}]", flush=True)
        proposer.exclude_same_prompt = False
        proposer.replies.add = add


if __name__ == "__main__":
    main()
