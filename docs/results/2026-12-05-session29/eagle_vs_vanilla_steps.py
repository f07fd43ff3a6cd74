"""Steady decode at concurrency 32, prose: a vanilla engine and one with the s27 EAGLE head under
the adaptive policy (which drafts nothing here), in one process, 40 steps each, alternated."""
import os
import time

from specserve import LLM, SamplingParams
from specserve.bench.workloads import load_workload

d = os.path.expanduser("~/.cache/specserve/drafts/s27-eagle")
make = {"vanilla": lambda: LLM().engine,
        "eagle": lambda: LLM(speculative_config={"method": "eagle", "model": d},
                             speculation_policy="adaptive").engine}
# ORDER=eagle,vanilla builds the EAGLE engine first (where its memory lies may matter)
engines = {k: make[k]() for k in os.environ.get("ORDER", "vanilla,eagle").split(",")}
if os.environ.get("NO_AUX"):  # the EAGLE engine's target forward exactly as vanilla's
    engines["eagle"].runner.aux_layers = ()
    engines["eagle"].proposer.needs_hidden = False
items = load_workload("prose")
p = SamplingParams(temperature=0, max_tokens=100000, ignore_eos=True)
for e in engines.values():
    for x in [e.apply_chat_template(it.messages) for it in items][:32]:
        e.add_request(x, p)
    for _ in range(20):
        e.step()
res = {k: [] for k in engines}
for rnd in range(6):
    for name, e in engines.items():
        s0 = e.get_stats()
        t0 = time.perf_counter()
        for _ in range(40):
            e.step()
        wall = (time.perf_counter() - t0) / 40
        s1 = e.get_stats()
        spec = (s1.get("spec_time_s", 0) - s0.get("spec_time_s", 0)) / 40
        res[name].append((wall, spec))
        print(f"round {rnd} {name:8s} step {wall*1e3:.2f} ms  spec {spec*1e3:.3f} ms  drafts "
              f"{s1['num_draft_tokens'] - s0['num_draft_tokens']}", flush=True)
for r in range(6):
    print(f"round {r}: eagle/vanilla step time {res['eagle'][r][0] / res['vanilla'][r][0]:.3f}")
