"""Dense decode-step curve: the fastest of 5 forwards of n sequences x 1 token (context 96),
with logits for every row (a verification step), n = 1..80, next to the start-up profile's
fitted curve with steps at ROW_STEPS (now) and without them (session 27's fit, same points)."""
import numpy as np
import torch
from specserve import LLM
from specserve.spec_decode import profiler as P
from specserve.spec_decode.cost_model import StepCostModel, fit_knee_curve

llm = LLM()
runner = llm.engine.runner
raw = {}
real_fit = P.fit_knee_curve
def capture(x, y, jumps=()):
    raw.setdefault("xy", (list(x), list(y)))
    return real_fit(x, y, jumps)
P.fit_knee_curve = capture
model = P.profile_forward(runner)
x, y = raw["xy"]
old = StepCostModel(x, fit_knee_curve(x, y))
ns = list(range(1, 81))
seq = lambda i: P._fake_seq(runner, i, 96)
runner.execute(runner.prepare([(seq(i), 1) for i in range(80)]), torch.arange(80))
times = [P._fastest(runner, [(seq(i), 1) for i in range(n)], torch.arange(n), 5) for n in ns]
print("profile points:", " ".join(f"{a}:{b*1e3:.2f}" for a, b in zip(x, y)))
print("  n  measured  fit-steps  fit-knee   (ms)")
for n, t in zip(ns, times):
    print(f"{n:3d} {t*1e3:8.2f} {model(n)*1e3:9.2f} {old(n)*1e3:9.2f}", flush=True)
m, s, k = (np.array(times), np.array([model(n) for n in ns]), np.array([old(n) for n in ns]))
print(f"mean |error|: steps {np.mean(np.abs(s/m-1))*100:.1f}%  knee {np.mean(np.abs(k/m-1))*100:.1f}%")
for a, b in [(32, 33), (16, 17), (32, 36), (24, 32)]:
    print(f"T({b})-T({a}): measured {(times[b-1]-times[a-1])*1e3:.2f}  steps "
          f"{(model(b)-model(a))*1e3:.2f}  knee {(old(b)-old(a))*1e3:.2f} ms")
