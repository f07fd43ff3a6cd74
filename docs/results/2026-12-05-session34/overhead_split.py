"""Where adaptive's time goes, next to other policies on one engine (n-gram proposer, K_max 4):
WORKLOAD (env, default prose) at concurrency C (default 4), POLICIES (default off,adaptive)
alternated, the order rotated every round, ROUNDS rounds of N prompts, each run as `bench sweep`
runs it (prefix cache emptied, then warmed with the shared prefix). Per run: tok/s, and per step
the engine's forward (+ sampling), its speculation work (observe_step + plan + look-ups), the
rest of step(), and the loop's time outside step(); steps, drafts, accepted, K histogram. Ends
with the medians per policy and adaptive's per-round ratio to every other policy."""
import os
import statistics

from specserve import LLM
from specserve.bench.lab import prepare_workload, proposer_config, run_workload, warm_up
from specserve.bench.sweep import parse_policy

C = int(os.environ.get("C", 4))
ROUNDS = int(os.environ.get("ROUNDS", 10))
N = int(os.environ.get("N", 32))
WORKLOAD = os.environ.get("WORKLOAD", "prose")
POLICIES = os.environ.get("POLICIES", "off,adaptive").split(",")
# As `bench sweep` builds its engine: prefix caching on, room for 128 sequences.
llm = LLM(speculative_config=proposer_config("ngram", 4), speculation_policy="adaptive",
          enable_prefix_caching=True, max_num_seqs=128)
e = llm.engine
warm_up(e)
w = prepare_workload(e, WORKLOAD, cap=32)
installed: dict = {}  # one policy object per name, kept across rounds as the sweep does
rows: dict[str, list[tuple]] = {p: [] for p in POLICIES}
for r in range(ROUNDS):
    for pol in POLICIES[r % len(POLICIES):] + POLICIES[:r % len(POLICIES)]:
        if pol in installed:
            e.spec_policy = installed[pol]
        else:
            e.set_speculation_policy(*parse_policy(pol, 4))
            installed[pol] = e.spec_policy
        run = run_workload(e, w, C, N, warm_shared_prefix=True)
        n = run["num_steps"]  # the run's own counters: the shared prefix's warm-up left out
        fwd, spec, step = (run[k] / n for k in ("forward_time_s", "spec_time_s", "step_time_s"))
        row = (run["output_tok_s"], 1e3 * fwd, 1e3 * spec, 1e3 * (step - fwd - spec),
               1e3 * (run["wall_s"] / n - step))
        rows[pol].append(row)
        print(f"{pol:17s} {WORKLOAD} c{C} {row[0]:7.1f} tok/s  forward {row[1]:.3f}  spec "
              f"{row[2]:.3f}  rest {row[3]:.3f}  loop {row[4]:.3f} ms/step  steps {n}  drafts "
              f"{run['num_draft_tokens']} accepted {run['num_accepted_tokens']}  K "
              f"{run['spec_k_histogram']}", flush=True)
for pol, rs in rows.items():
    med = [statistics.median(x[i] for x in rs) for i in range(5)]
    print(f"median {pol:17s} {med[0]:7.1f} tok/s  forward {med[1]:.3f}  spec {med[2]:.3f}  "
          f"rest {med[3]:.3f}  loop {med[4]:.3f} ms/step")
for pol in POLICIES:
    if pol != "adaptive" and "adaptive" in rows:
        ratios = [a[0] / o[0] for a, o in zip(rows["adaptive"], rows[pol], strict=True)]
        print(f"adaptive/{pol} per round: {[round(x, 3) for x in ratios]}  "
              f"median {statistics.median(ratios):.3f}")
