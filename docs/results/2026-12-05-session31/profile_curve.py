import torch
from specserve import LLM
from specserve.spec_decode import profiler
llm = LLM()
r = llm.engine.runner
for rep in range(2):
    m = profiler.profile_forward(r)
    print("fit ms:", {int(x): round(y * 1e3, 2) for x, y in zip(m.x, m.y) if x <= 33})
    print("kv_read_s", m.kv_read_s, "attention_s", m.attention_s)
# raw, dense
from specserve.spec_decode.profiler import _fastest, _fake_seq
for rep in range(2):
    print("raw ms:", {n: round(_fastest(r, [(_fake_seq(r, i, 96), 1) for i in range(n)], torch.arange(n), 5) * 1e3, 2) for n in (1, 2, 3, 4, 6, 8, 10, 12, 16, 17)})
