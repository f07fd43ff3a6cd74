"""Record the target's raw start-up profile (the fastest run per point, before the fit) from N
fresh engines, every point, as JSON: the data the profile fits are compared on offline.
Usage: N=6 python profile_capture.py OUT.json"""
import json
import os
import sys

from specserve.spec_decode import profiler

raw = []
orig = profiler.fit_knee_curve


def recording(x, y, *args, **kwargs):
    raw.append({"n": list(x), "seconds": list(y), "jumps": list(args[0]) if args else []})
    return orig(x, y, *args, **kwargs)


profiler.fit_knee_curve = recording
from specserve.llm import LLM  # noqa: E402

profiles = []
for _ in range(int(os.environ.get("N", "6"))):
    raw.clear()
    llm = LLM(speculative_config={"method": "ngram"}, speculation_policy="adaptive")
    profiles.append(raw[0])  # the decode curve (the chunk curve is fitted second)
    print(" ".join(f"{n}:{t * 1e3:.2f}" for n, t in zip(raw[0]["n"], raw[0]["seconds"])),
          flush=True)
    del llm
json.dump({"cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": "),
           "profiles": profiles}, open(sys.argv[1], "w"), indent=1)
