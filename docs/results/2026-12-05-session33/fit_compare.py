"""Recorded raw start-up profiles fitted two ways: one knee (the fit before b80c134, rebuilt here
from the same helpers) and the shipped fit (cost_model.fit_knee_curve, which may bend twice).
Profiles: the six Zen 3 engines of profiles-zen3.json and the AMX Xeon's profile recorded in
session 28 (dense_curve.txt). Prints T at 1-24 tokens, T(2) - T(1), T(4) - T(1), the largest
relative error and the sum of squared relative errors.
Usage: python fit_compare.py [profiles-zen3.json]"""
import json
import sys
from pathlib import Path

import numpy as np

from specserve.spec_decode.cost_model import (
    best_relative_fit,
    fit_knee_curve,
    one_knee_bases,
    relative_sse,
    step_columns,
)

here = Path(__file__).parent


def one_knee(x, y, jumps):
    x = np.asarray(x, dtype=np.float64)
    return best_relative_fit(y, one_knee_bases(x, step_columns(x, jumps)))


def main():
    zen3 = json.load(open(sys.argv[1] if len(sys.argv) > 1 else here / "profiles-zen3.json"))
    profiles = [(f"zen3 #{i}", p["n"], p["seconds"], tuple(p["jumps"]))
                for i, p in enumerate(zen3["profiles"])]
    line = next(s for s in open(here.parent / "2026-12-05-session28/dense_curve.txt")
                if s.startswith("profile points:"))
    pts = [tuple(map(float, p.split(":"))) for p in line.split(":", 1)[1].split()]
    profiles.append(("xeon s28", [int(n) for n, _ in pts], [t / 1e3 for _, t in pts],
                     (16, 32, 64, 128)))
    for name, x, y, jumps in profiles:
        y = np.array(y)
        small = [i for i, n in enumerate(x) if n <= 24]
        print(f"{name}\n  n        " + " ".join(f"{x[i]:6d}" for i in small))
        for label, f in (("raw", y), ("one knee", np.array(one_knee(x, y, jumps))),
                         ("shipped", np.array(fit_knee_curve(x, y, jumps)))):
            print(f"  {label:9s}" + " ".join(f"{f[i] * 1e3:6.2f}" for i in small)
                  + f" | T(2)-T(1) {(f[1] - f[0]) * 1e3:5.2f}"
                  f" T(4)-T(1) {(f[3] - f[0]) * 1e3:5.2f} ms"
                  f" | max rel err {np.abs(f / y - 1).max():.3f} sse {relative_sse(f, y):.4f}")


if __name__ == "__main__":
    main()
