import torch
from torch.profiler import profile, ProfilerActivity
from specserve import LLM
from specserve.spec_decode.profiler import _fake_seq, _fastest
llm = LLM()
runner = llm.engine.runner
S, q = 32, 3
shape = [(_fake_seq(runner, i, 192, q), q) for i in range(S)]
rows = torch.arange(S * q)
_fastest(runner, shape, rows, 3)
inputs = runner.prepare(shape)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(5): runner.execute(inputs, rows)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
