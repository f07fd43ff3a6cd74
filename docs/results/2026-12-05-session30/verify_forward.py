"""Target forward time for verify-shaped steps: S sequences x q tokens (logits for all), ctx 192."""
import torch, statistics
from specserve import LLM
from specserve.spec_decode.profiler import _fake_seq, _fastest
llm = LLM()
runner = llm.engine.runner
for S, q in ((32, 1), (32, 2), (32, 3), (32, 4), (64, 1), (64, 2), (64, 3), (16, 5), (24, 4)):
    shape = [(_fake_seq(runner, i, 192, q), q) for i in range(S)]
    rows = torch.arange(S * q)
    ts = [_fastest(runner, shape, rows, 5) for _ in range(3)]
    print(f"{S:3d} seqs x {q} tokens = {S*q:3d} rows: {statistics.median(ts)*1e3:6.2f} ms", flush=True)
