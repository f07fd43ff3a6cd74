import time, torch, statistics
from specserve import LLM, SamplingParams
from specserve.bench.offline import make_prompts
llm = LLM(); e = llm.engine
for p in make_prompts(llm.get_tokenizer(), 32, 192): e.add_request(p, SamplingParams(temperature=0, max_tokens=10000, ignore_eos=True))
for _ in range(10): e.step()
sched = [(r, 1) for r in e.scheduler.running]
inputs = e.runner.prepare(sched)
idx = torch.arange(32)
def run(aux, n=30):
    e.runner.aux_layers = aux
    t = time.perf_counter()
    for _ in range(n): e.runner.execute(inputs, idx, float32_logits=False)
    return (time.perf_counter() - t) / n * 1e3
for r in range(4):
    a = run(()); b = run((2, 14)); c = run(())
    print(f"no aux {a:.2f}  aux {b:.2f}  no aux {c:.2f} ms")
# where: the loop alone
ll = e.runner.layer_loop
def loop(aux, n=30):
    t = time.perf_counter()
    for _ in range(n): ll.forward(inputs.input_ids, inputs.positions, inputs.meta, aux_layers=aux) if aux else ll.forward(inputs.input_ids, inputs.positions, inputs.meta)
    return (time.perf_counter() - t) / n * 1e3
for r in range(3):
    print(f"loop only: no aux {loop(()):.2f}  aux {loop((2, 14)):.2f}")
