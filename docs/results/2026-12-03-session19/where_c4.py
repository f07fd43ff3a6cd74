"""Where adaptive loses at prose / concurrency 4 (n-gram): every step of interleaved rounds
of per-request policy `off` and `adaptive` on one engine, split into target forward (with
sampling / verification) and the rest, by kind of step (decode only, with drafts, with prefill).
Usage (from the repo root): python docs/results/2026-12-03-session19/where_c4.py WORKLOAD C ROUNDS"""
import statistics, sys, time
from collections import defaultdict
from specserve import SamplingParams
from specserve.bench.lab import build_llm, prepare_workload, proposer_config, warm_up
from specserve.bench.workloads import load_workload

workload, conc, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = build_llm(None, {"speculative_config": proposer_config("ngram", 4),
                       "speculation_policy": "adaptive"})
e = llm.engine
warm_up(e)
wl = prepare_workload(e, workload, load_workload(workload), cap=32)
pol = e.spec_policy
cur = {}
orig_sched, orig_obs = e.scheduler.schedule, pol.observe_step

def schedule():
    s = orig_sched()
    cur["prefill"] = any(r.num_computed_tokens < r.num_prompt_tokens for r, _ in s.scheduled)
    cur["seqs"] = len(s.scheduled)
    return s

def observe(num_tokens, forward_s, *a, **k):
    cur["n"], cur["fwd"] = num_tokens, forward_s
    orig_obs(num_tokens, forward_s, *a, **k)

e.scheduler.schedule, pol.observe_step = schedule, observe
prompts = wl.take(conc * 6)
steps = {"off": [], "adaptive": []}
tput = defaultdict(list)
for r in range(rounds):
    for name in (["off", "adaptive"] if r % 2 == 0 else ["adaptive", "off"]):
        params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True,
                                speculation_policy=name)
        todo, t0 = list(prompts), time.perf_counter()
        while todo or e.has_unfinished_requests():
            while todo and len(e.scheduler.running) + len(e.scheduler.waiting) < conc:
                e.add_request(todo.pop()[0], params)
            cur.clear()
            s0 = time.perf_counter()
            e.step()
            st = time.perf_counter() - s0
            if "n" in cur:
                kind = "prefill" if cur["prefill"] else ("draft" if cur["n"] > cur["seqs"] else "decode")
                steps[name].append((kind, cur["n"], cur["seqs"], cur["fwd"], st))
        tput[name].append(time.perf_counter() - t0)
ratio = [o / a for o, a in zip(tput["off"], tput["adaptive"])]
print(f"{workload} c{conc} {rounds} rounds; wall off/adaptive per round: median {statistics.median(ratio):.3f}",
      [round(x, 3) for x in ratio])
for name, rows in steps.items():
    print(f"== {name}: {len(rows)} steps, total {sum(r[4] for r in rows):.2f} s")
    by = defaultdict(list)
    for kind, n, seqs, fwd, st in rows:
        by[(kind, n - seqs if kind != "prefill" else -1, seqs)].append((fwd, st))
    print("  kind    extra seqs  steps  fwd ms(med)  step ms(med)  rest ms(med)  total s")
    for key in sorted(by, key=lambda k: (k[0], k[1], k[2])):
        v = by[key]
        if len(v) < 3 and key[0] != "draft":
            continue
        f = statistics.median(x[0] for x in v); s = statistics.median(x[1] for x in v)
        rest = statistics.median(x[1] - x[0] for x in v)
        print(f"  {key[0]:8} {key[1]:5} {key[2]:4} {len(v):6} {1e3*f:11.2f} {1e3*s:12.2f} {1e3*rest:12.2f} {sum(x[1] for x in v):8.2f}")
