"""c1: server vs offline, per-request TTFT, TPOT, and request gap (end of one to start of next)."""
import random, statistics, os, sys
sys.path.insert(0, "docs/results/2026-12-02-session15")
from _live import SERVE_WRAP, launch, wait_healthy
from specserve.bench.online import run_client, run_online_point
from specserve.bench.lab import prepare_workload, run_workload, warm_up
from specserve.bench.workloads import load_workload
from specserve import LLM
ROUNDS = int(os.environ.get("ROUNDS", "10")); CAP = 32; C = int(os.environ.get("C", "1")); NP = int(os.environ.get("NP", "8"))
p = launch(8060, os.environ.get("ARGS", "").split())
wait_healthy(8060)
items = load_workload("prose")
llm = LLM(); warm_up(llm.engine)
wl = prepare_workload(llm.engine, "prose", items, cap=CAP)
run_client(run_online_point("http://127.0.0.1:8060", items, 8, 16, max_tokens_cap=CAP, ignore_eos=True))
rng = random.Random(0)
res = {"offline": [], "server": []}
try:
    for r in range(ROUNDS):
        sides = ["offline", "server"]; rng.shuffle(sides)
        for s in sides:
            if s == "offline":
                out = run_workload(llm.engine, wl, C, NP, True, reset_prefix_cache=False)
            else:
                out = run_client(run_online_point("http://127.0.0.1:8060", items, C, NP, max_tokens_cap=CAP, ignore_eos=True, warm_up=False))
            res[s].append(out)
finally:
    p.terminate()
def med(xs): return statistics.median(xs)
for s, outs in res.items():
    reqs = [q for o in outs for q in o["requests"]]
    ttft = med([q["ttft_s"] * 1e3 for q in reqs]); tpot = med([q["tpot_s"] * 1e3 for q in reqs if q["tpot_s"]])
    dur = med([(q["end_s"] - q["start_s"]) * 1e3 for q in reqs])
    gaps = []
    for o in outs:
        rq = sorted(o["requests"], key=lambda q: q["start_s"])
        gaps += [b["start_s"] - a["end_s"] for a, b in zip(rq, rq[1:])] if C == 1 else []
    first_start = med([min(q["start_s"] for q in o["requests"]) * 1e3 for o in outs])
    last_end = med([(o["wall_s"] - max(q["end_s"] for q in o["requests"])) * 1e3 for o in outs])
    print(f"{s:8s} tok/s {med([o['output_tok_s'] for o in outs]):6.1f} ttft {ttft:6.2f} ms tpot {tpot:6.2f} ms req {dur:7.1f} ms gap {med(gaps)*1e3 if gaps else 0:6.3f} ms first_start {first_start:.2f} tail {last_end:.2f}")
print("ratio per round", [round(b["output_tok_s"] / a["output_tok_s"], 3) for a, b in zip(res["offline"], res["server"])])
