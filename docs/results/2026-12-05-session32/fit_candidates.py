"""The target's raw start-up profile from N fresh engines (the fastest run per point, as
profile_forward measures it), fitted two ways on the same points: the shipped one-knee fit
(cost_model.fit_knee_curve) and a candidate, a convex curve of up to two hinges
T(n) = a + b0 n + b1 max(n - k1, 0) + b2 max(n - k2, 0) + steps (b >= 0, so slopes only grow),
least squares in relative error like the shipped fit. Prints, per engine, T at 1-16 tokens:
raw, shipped fit, candidate, and T(2) - T(1) under each. Usage: N=4 python fit_candidates.py"""
import os

import numpy as np

from specserve.spec_decode import profiler
from specserve.spec_decode.cost_model import best_relative_fit, fit_knee_curve, step_columns


def fit_convex_hinges(x, y, jumps=()):
    x = np.asarray(x, dtype=np.float64)
    steps = step_columns(x, jumps)
    return best_relative_fit(y, (
        np.stack([np.ones_like(x), x, *(np.maximum(x - k, 0.0) for k in {k1, k2}), *steps],
                 axis=1)
        for i, k1 in enumerate(x) for k2 in x[i:]))


raw = []
orig = profiler.fit_knee_curve


def recording(x, y, *args, **kwargs):
    raw.append((list(x), list(y), args))
    return orig(x, y, *args, **kwargs)


profiler.fit_knee_curve = recording
from specserve.llm import LLM  # noqa: E402

for _ in range(int(os.environ.get("N", "4"))):
    raw.clear()
    llm = LLM(speculative_config={"method": "ngram"}, speculation_policy="adaptive")
    x, y, args = raw[0]
    shipped = fit_knee_curve(x, y, *args)
    cand = fit_convex_hinges(x, y, *args)
    small = [i for i, n in enumerate(x) if n <= 16]
    print("n        ", " ".join(f"{x[i]:6d}" for i in small))
    for name, c in (("raw", y), ("one knee", shipped), ("hinges", cand)):
        print(f"{name:9s}", " ".join(f"{c[i] * 1e3:6.2f}" for i in small),
              f"| T(2)-T(1) {(c[1] - c[0]) * 1e3:5.2f} ms | max rel err "
              f"{max(abs(a / b - 1) for a, b in zip(c, y, strict=True)):.3f}")
    del llm
