"""test_profile_fit_recovers_a_knee_curve_through_noise's three curves, over SEEDS noise seeds
instead of the test's one: how often the one-knee fit (before b80c134) and the shipped fit fail
the test's conditions (monotone, every point within 8% of the truth, at least half the true slope
over the flat stretch T(3) -> T(6)).
Usage (beside fit_compare.py):
    cd docs/results/2026-12-05-session33 && SEEDS=200 python noise_seeds.py"""
import os

import numpy as np
from fit_compare import one_knee

from specserve.spec_decode.cost_model import fit_knee_curve

points = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]
fails = {("one knee", k): 0 for k in (8, 64, 1)} | {("shipped", k): 0 for k in (8, 64, 1)}
seeds = int(os.environ.get("SEEDS", "200"))
for seed in range(seeds):
    rng = np.random.default_rng(seed)
    for knee, flat, slope in [(8, 5e-3, 4e-4), (64, 2e-3, 1e-5), (1, 6e-3, 4e-4)]:
        truth = np.array([flat + slope * max(n - knee, 0) for n in points])
        noisy = truth * rng.uniform(0.93, 1.07, size=len(points))
        noisy[3:5] = noisy[2]  # the test's flat stretch
        for name, fit_fn in (("one knee", one_knee), ("shipped", fit_knee_curve)):
            fit = np.array(fit_fn(points, noisy.tolist(), ()))
            ok = (np.all(np.diff(fit) >= -1e-12) and np.all(np.abs(fit / truth - 1) < 0.08)
                  and fit[4] - fit[2] >= 0.5 * (truth[4] - truth[2]))
            fails[(name, knee)] += not ok
for (name, knee), n in fails.items():
    print(f"{name:9s} knee {knee:3d}: fails {n} of {seeds} seeds")
