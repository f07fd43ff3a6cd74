import time
from specserve import LLM, SamplingParams
from specserve.bench.workloads import load_workload
llm = LLM(); e = llm.engine
items = load_workload("prose")
prompts = [e.apply_chat_template(it.messages) for it in items][:12]
p = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
for x in prompts[:3]:
    e.add_request(x, p)
    while e.has_unfinished_requests(): e.step()
for x in prompts[3:]:
    e.add_request(x, p)
    t0 = time.perf_counter(); e.step(); t1 = time.perf_counter(); e.step(); t2 = time.perf_counter()
    while e.has_unfinished_requests(): e.step()
    n = len(e.tokenizer(x, add_special_tokens=False).input_ids) if isinstance(x, str) else len(x)
    print(f"prompt {n} tokens: first step {1e3*(t1-t0):.1f} ms, second {1e3*(t2-t1):.1f} ms")
