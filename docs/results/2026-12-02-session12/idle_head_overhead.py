"""What a loaded EAGLE head costs the target's steps when it proposes nothing: two engines in one
process, vanilla and the adaptive EAGLE engine with every plan forced to K = 0, run the same
batch of prose prompts in alternation; step time per generated token, and the time of the
features hand-over (engine._hand_over_hidden) inside it.

    python idle_head_overhead.py HEAD_DIR [CONCURRENCY] [ROUNDS]
"""
import statistics
import sys
import time

from specserve import LLM, SamplingParams
from specserve.bench.workloads import load_workload

head, conc = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 32
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 4
vanilla = LLM(kv_cache_memory=1 << 30, enable_prefix_caching=False)
eagle = LLM(kv_cache_memory=1 << 30, enable_prefix_caching=False, speculation_policy="adaptive",
            speculative_config={"method": "eagle", "model": head})
eagle.engine.spec_policy.choose = lambda reqs, *a, **k: [0] * len(reqs)
engine = eagle.engine
handover = [0.0]
inner = engine._hand_over_hidden


def timed(*args):
    t0 = time.perf_counter()
    inner(*args)
    handover[0] += time.perf_counter() - t0


engine._hand_over_hidden = timed
items = load_workload("prose")
ids = [vanilla.engine.apply_chat_template(items[i % len(items)].messages) for i in range(conc)]
params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
per_token = {"vanilla": [], "eagle (idle)": []}
shares = []
for r in range(rounds):
    for name, llm in (("vanilla", vanilla), ("eagle (idle)", eagle))[::1 if r % 2 else -1]:
        s0 = llm.engine.stats.step_time
        handover[0] = 0.0
        llm.generate(ids, params)
        steps = llm.engine.stats.step_time - s0
        per_token[name].append(steps / (conc * 64))
        if name != "vanilla":
            shares.append(handover[0] / steps)
for name, v in per_token.items():
    print(f"{name:13s} step time per output token: median {1e3 * statistics.median(v):.3f} ms "
          f"over {rounds} rounds {[round(1e3 * x, 3) for x in v]}")
print(f"eagle/vanilla: {statistics.median(per_token['eagle (idle)']) / statistics.median(per_token['vanilla']):.3f}; "
      f"hand-over share of the eagle engine's step time: median {100 * statistics.median(shares):.2f}%")
