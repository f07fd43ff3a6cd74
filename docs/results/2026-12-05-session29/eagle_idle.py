"""Session 27's eagle_idle.py for the session-29 interface: the s27 EAGLE head under the adaptive
policy, 32 prose requests in steady decode (the policy drafts nothing there), 60 steps timed,
the hand-over's parts wrapped. Run from a checkout: python .../eagle_idle.py"""
import collections
import os
import time

from specserve import LLM, SamplingParams
from specserve.bench.workloads import load_workload

d = os.path.expanduser("~/.cache/specserve/drafts/s27-eagle")
llm = LLM(speculative_config={"method": "eagle", "model": d}, speculation_policy="adaptive")
e = llm.engine
T = collections.defaultdict(float)


def wrap(obj, name):
    if not hasattr(obj, name):
        return
    f = getattr(obj, name)

    def g(*a, **k):
        t = time.perf_counter()
        r = f(*a, **k)
        T[name] += time.perf_counter() - t
        return r
    setattr(obj, name, g)


for n in ["_hand_over_hidden", "_propose"]:
    wrap(e, n)
wrap(e.spec_policy, "observe_step")
for n in ["target_features", "on_target_hidden"]:
    wrap(e.proposer, n)
items = load_workload("prose")
prompts = [e.apply_chat_template(it.messages) for it in items][:32]
p = SamplingParams(temperature=0, max_tokens=100000, ignore_eos=True)
for x in prompts:
    e.add_request(x, p)
for _ in range(20):
    e.step()
for rep in range(3):
    T.clear()
    s0 = dict(e.get_stats())
    t0 = time.perf_counter()
    N = 60
    for _ in range(N):
        e.step()
    wall = time.perf_counter() - t0
    s1 = e.get_stats()
    print(f"step {wall/N*1e3:.2f} ms, spec_time {(s1['spec_time_s']-s0['spec_time_s'])/N*1e3:.3f}"
          f" ms/step, drafts {s1['num_draft_tokens']-s0['num_draft_tokens']}")
    for k, v in T.items():
        print(f"  {k:20s} {v/N*1e3:.3f} ms/step")
