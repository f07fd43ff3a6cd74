"""The AcceptanceTracker alone: a request running alone drafts K = 1 whenever its first-position
estimate is over THR (about the plan's break-even at concurrency 1 here); first guesses are right
with probability alpha; 10 requests x 64 tokens; share of steps that drafted, mean of 20 seeds.
Final code: draws (sample_prior) or means, a fitted or fixed prior weight. Run from the repo root."""
import random
from specserve.spec_decode.acceptance import AcceptanceTracker

THR = 0.18


def run(alpha, ts=True, w=None, nreq=10, tokens=64, seed=0):
    rng = random.Random(seed)
    acc = AcceptanceTracker(4, prior_weight=w)
    acc._rng = random.Random(seed + 1000)
    drafted = steps = 0
    for r in range(nreq):
        rid, out = str(r), 0
        while out < tokens:
            rates = acc.sample_prior() if ts else None
            steps += 1
            if acc.estimates([rid], rates)[0][0] > THR:
                drafted += 1
                hit = rng.random() < alpha
                acc.observe(rid, 1, int(hit))
                out += 1 + hit
            else:
                out += 1
        acc.forget(rid)
    return drafted / steps


for label, kw in [("means, weight 3", dict(ts=False, w=3.0)), ("draws, weight 3", dict(w=3.0)),
                  ("means, fitted weight", dict(ts=False)), ("draws, fitted weight (shipped)", {})]:
    print(f"{label:32s}", "  ".join(f"alpha {a}: {sum(run(a, seed=s, **kw) for s in range(20)) / 20:.2f}"
                                    for a in (0.05, 0.1, 0.2, 0.3, 0.5)))
