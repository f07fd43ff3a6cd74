"""Adaptive vs static K=4 with the lab's trained 3-layer draft on 4 json prompts at concurrency 1
(session 5): throughput, the chosen-K histogram, the cost model before and after the run.

Usage: python docs/results/2026-11-30-session5/adaptive_json_check.py adaptive|static
(`specserve bench lab` trains the draft into ~/.cache/specserve/drafts when none is cached.)
"""

from __future__ import annotations

import os
import sys
import time

from specserve import LLM, SamplingParams
from specserve.bench.workloads import load_workload

DRAFT = os.path.expanduser("~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-3")


def main(policy: str) -> None:
    llm = LLM(speculative_config={"method": "draft", "model": DRAFT, "num_speculative_tokens": 4},
              speculation_policy=policy, enable_prefix_caching=False)
    eng = llm.engine
    target, draft = eng._cost_models or (None, None)

    def curve() -> str:
        return (f"target T(1..6) ms {[round(float(target(n)) * 1e3, 2) for n in range(1, 7)]}, "
                f"draft T(1) ms {float(draft(1)) * 1e3:.2f}")

    if target is not None:
        print("profiled:", curve())
    prompts = [eng.apply_chat_template(it.messages) for it in load_workload("json")[:4]]
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    t0, n = time.perf_counter(), 0
    for p in prompts:
        n += len(llm.generate([p], params)[0].outputs[0].token_ids)
    print(f"{policy}: {n / (time.perf_counter() - t0):.1f} tok/s")
    st = llm.get_stats()
    print({k: st.get(k) for k in ("spec_k_histogram", "spec_step_time_rel_error",
                                  "acceptance_rate", "spec_global_acceptance", "num_steps")})
    if target is not None:
        print(f"after: scales {target.scale:.3f} / {draft.scale:.3f};", curve())


if __name__ == "__main__":
    main(sys.argv[1])
