"""The target's raw start-up profile (the fastest run per point, before the fit) next to the
fitted curve, at 1-16 tokens: is the flat-then-linear fit choosing between a knee at 1 and one
at 2-4 on a curve that rises gradually? Usage: python profile_raw.py"""
from specserve.spec_decode import profiler

seen = []
fit = profiler.fit_knee_curve


def recording_fit(x, y, *args, **kwargs):
    out = fit(x, y, *args, **kwargs)
    seen.append((list(x), list(y), out))
    return out


profiler.fit_knee_curve = recording_fit
from specserve import LLM  # noqa: E402

LLM(speculative_config={"method": "ngram"}, speculation_policy="adaptive")
x, y, out = seen[0]  # the decode curve (the chunk curve is fitted second)
print("n      ", " ".join(f"{n:6d}" for n in x if n <= 16))
print("raw ms ", " ".join(f"{t * 1e3:6.2f}" for n, t in zip(x, y) if n <= 16))
print("fit ms ", " ".join(f"{t * 1e3:6.2f}" for n, t in zip(x, out) if n <= 16))
