"""Fine-grained interleaved A/B: many short runs of each side in shuffled order per round; the
figure is the median over rounds of side/offline within the round (the machine's speed drifts
over seconds, so only adjacent runs are compared)."""
import random, statistics, os
from _live import SERVE_WRAP, launch, wait_healthy
from specserve.bench.online import run_client, run_online_point
from specserve.bench.lab import prepare_workload, run_workload, warm_up
from specserve.bench.workloads import load_workload
from specserve import LLM

ROUNDS = int(os.environ.get("ROUNDS", "40")); CAP = int(os.environ.get("CAP", "32"))
CONCS = [int(c) for c in os.environ.get("CONCS", "1,8,32").split(",")]
NP = {1: 4, 8: 16, 32: 64}
servers = {}
for k, spec in enumerate(os.environ["VARIANTS"].split(";")):
    name, _, envs = spec.partition("=")
    extra = dict(kv.split(":", 1) for kv in envs.split(",") if kv)
    port = 8050 + k
    cmd = extra.pop("CMD", SERVE_WRAP)
    args = extra.pop("ARGS", "").split()
    servers[name] = (port, launch(port, args, env=extra, cmd=cmd))
for port, _ in servers.values():
    wait_healthy(port)
items = load_workload("prose")
llm = LLM()
warm_up(llm.engine)
wl = prepare_workload(llm.engine, "prose", items, cap=CAP)
rng = random.Random(0)
for name, (port, _) in servers.items():
    run_client(run_online_point(f"http://127.0.0.1:{port}", items, 8, 16, max_tokens_cap=CAP, ignore_eos=True))
res = {}
try:
    for c in CONCS:
        for r in range(ROUNDS):
            sides = list(servers) + ["offline"]
            rng.shuffle(sides)
            for side in sides:
                if side == "offline":
                    out = run_workload(llm.engine, wl, c, NP[c], True, reset_prefix_cache=False)
                else:
                    out = run_client(run_online_point(f"http://127.0.0.1:{servers[side][0]}", items, c, NP[c], max_tokens_cap=CAP, ignore_eos=True, warm_up=False))
                res.setdefault((c, side), []).append(out["output_tok_s"])
            if r % 10 == 9:
                print(c, r + 1, {s: round(statistics.median([a / b for a, b in zip(res[(c, s)], res[(c, 'offline')])]), 3) for s in servers}, flush=True)
finally:
    for _, p in servers.values():
        p.terminate()
print(f"\n{ROUNDS} rounds, prose, {CAP} output tokens; per-round ratio to offline: median [quartiles]")
for c in CONCS:
    off = res[(c, "offline")]
    print(f"c{c} offline tok/s median {statistics.median(off):.1f} (range {min(off):.0f}-{max(off):.0f})")
    for side in servers:
        runs = res[(c, side)]
        ratios = sorted(a / b for a, b in zip(runs, off))
        q = statistics.quantiles(ratios, n=4)
        print(f"  {side:10s} tok/s median {statistics.median(runs):6.1f}  ratio median {statistics.median(ratios):.3f} [{q[0]:.3f}, {q[2]:.3f}]  mean {statistics.mean(ratios):.3f}")
