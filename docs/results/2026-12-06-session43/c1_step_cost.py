"""What a step costs at concurrency 1 by the tokens it carries, per policy, against what the cost
model predicts: one engine (n-gram proposer, prose, 32-token replies as bench sweep runs them),
the policies rotated round by round. Each step's whole wall time (schedule to propose) and its
forward time (forward + sampling / verification, what the cost model is fed) are filed under the
step's token count. WL=prose CONC=1 ROUNDS=4 POLICIES=off,static:1,static:4,adaptive."""
import collections, os, statistics, time
from specserve.bench.lab import build_llm, proposer_config, warm_up, prepare_workload, run_workload
from specserve.bench.sweep import SweepSettings, parse_policy

WL = os.environ.get("WL", "prose")
CONC = int(os.environ.get("CONC", "1"))
ROUNDS = int(os.environ.get("ROUNDS", "4"))
POLICIES = os.environ.get("POLICIES", "off,static:1,static:4,adaptive").split(",")
llm = build_llm(None, {"speculative_config": proposer_config("ngram", 4),
                       "speculation_policy": "adaptive", "enable_prefix_caching": True,
                       "max_num_seqs": 128})
eng = llm.engine
warm_up(eng)
pts = SweepSettings().points
w = prepare_workload(eng, WL, pts.items(WL), cap=pts.max_tokens_cap, scale=pts.max_tokens_scale)
steps = {p: collections.defaultdict(list) for p in POLICIES}  # tokens -> [(whole, forward, spec)]
gaps = {p: [] for p in POLICIES}
current = [None]
orig_step = eng.step
last_end = [None]
def step(*a, **k):
    s = eng.stats
    n0, f0, sp0 = s.num_step_tokens, s.forward_time, s.spec_time
    t0 = time.perf_counter()
    if last_end[0] is not None:
        gaps[current[0]].append(t0 - last_end[0])
    out = orig_step(*a, **k)
    t1 = time.perf_counter()
    last_end[0] = t1
    n = s.num_step_tokens - n0
    if n:
        steps[current[0]][n].append((t1 - t0, s.forward_time - f0, s.spec_time - sp0))
    return out
eng.step = step
installed, res = {}, {p: [] for p in POLICIES}
for r in range(ROUNDS):
    for p in POLICIES[r % len(POLICIES):] + POLICIES[:r % len(POLICIES)]:
        if p in installed:
            eng.spec_policy = installed[p]
        else:
            eng.set_speculation_policy(*parse_policy(p, 4))
            installed[p] = eng.spec_policy
        eng.planner.reset()
        current[0], last_end[0] = p, None
        res[p].append(run_workload(eng, w, CONC, pts.num_prompts(CONC), pts.ignore_eos,
                                   warm_shared_prefix=True))
print(f"{WL} c{CONC}, {ROUNDS} rounds of {pts.num_prompts(CONC)} requests; ms are medians")
off = res[POLICIES[0]]
for p in POLICIES:
    rs = res[p]
    ratios = [a["output_tok_s"] / b["output_tok_s"] for a, b in zip(rs, off)]
    print(f"{p:10s} tok/s {statistics.median(x['output_tok_s'] for x in rs):6.1f} ratio "
          f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] drafted "
          f"{sum(x['num_draft_tokens'] for x in rs)} accepted {sum(x['num_accepted_tokens'] for x in rs)}"
          f" steps {sum(len(v) for v in steps[p].values())} gap {1e3 * statistics.median(gaps[p]):.3f} ms")
    for n in sorted(steps[p]):
        v = steps[p][n]
        if len(v) < 5 or n > 8:
            continue
        print(f"   {n} tokens x{len(v):4d}: whole {1e3 * statistics.median(x[0] for x in v):6.2f}"
              f"  forward {1e3 * statistics.median(x[1] for x in v):6.2f}"
              f"  spec {1e3 * statistics.median(x[2] for x in v):5.2f}"
              f"  rest {1e3 * statistics.median(x[0] - x[1] - x[2] for x in v):5.2f}")
pol = installed.get("adaptive")
if pol is not None:
    print("cost model ms", {n: round(1e3 * pol.target_cost(n), 2) for n in (1, 2, 3, 5)})
