"""How much does a closed-loop client's turnaround cost the offline engine? The same closed loop as
run_workload, but a finished request's replacement is added one step later (what a server sees:
the final chunk goes out during the next step's forward, the new request arrives during it and is
scheduled on the step after). Alternated with run_workload itself, shuffled, many short rounds."""
import os, random, statistics, time
from collections import deque
from specserve import LLM, SamplingParams
from specserve.bench.lab import prepare_workload, run_workload, warm_up
from specserve.bench.workloads import load_workload

def run_delayed(engine, wl, concurrency, num_prompts):
    todo = deque(wl.take(num_prompts)); in_flight = set(); freed_last_step = 0; n_tok = 0
    t0 = time.perf_counter()
    while todo or in_flight:
        while todo and len(in_flight) + freed_last_step < concurrency:
            prompt, max_tokens = todo.popleft()
            in_flight.add(engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)).request_id)
        freed_last_step = 0
        for out in engine.step():
            if out.finished and out.request_id in in_flight:
                in_flight.remove(out.request_id); freed_last_step += 1
                n_tok += len(out.outputs[0].token_ids)
    return n_tok / (time.perf_counter() - t0)

ROUNDS = int(os.environ.get("ROUNDS", "30")); CAP = int(os.environ.get("CAP", "32"))
NP = {1: 4, 8: 16, 32: 64}
llm = LLM(); warm_up(llm.engine)
wl = prepare_workload(llm.engine, "prose", load_workload("prose"), cap=CAP)
rng = random.Random(0)
for c in [int(x) for x in os.environ.get("CONCS", "1,8,32").split(",")]:
    ratios = []
    for r in range(ROUNDS):
        sides = ["instant", "delayed"]; rng.shuffle(sides); res = {}
        for s in sides:
            res[s] = run_workload(llm.engine, wl, c, NP[c], True, reset_prefix_cache=False)["output_tok_s"] if s == "instant" else run_delayed(llm.engine, wl, c, NP[c])
        ratios.append(res["delayed"] / res["instant"])
    q = statistics.quantiles(ratios, n=4)
    print(f"c{c}: delayed/instant median {statistics.median(ratios):.3f} [{q[0]:.3f}, {q[2]:.3f}] over {ROUNDS} rounds, {CAP} tokens", flush=True)
