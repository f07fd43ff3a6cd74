"""int4_rows.py with cold weights, as in a served forward: 30 layers' worth of each shape
(~160 MB of bf16, far over the L3), called in turn, so that every call streams its weight from
memory. Per layer (the four matmuls), us, median of 5 passes over the 30 layers; 2 threads.
python int4_rows_cold.py"""
import statistics
import time

import torch

from specserve.layers.linear import PackedLinear
from specserve.quant.int4 import Int4Linear

torch.manual_seed(0)
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
LAYERS = 30
int4, bf16 = [], []
for _ in range(LAYERS):
    lins = {n: torch.nn.Linear(i, o, bias=False).to(torch.bfloat16) for n, (o, i) in SHAPES.items()}
    int4.append({n: Int4Linear.from_linear(lin, 32) for n, lin in lins.items()})
    bf16.append({n: PackedLinear(lin.weight, None) for n, lin in lins.items()})


def per_layer(layers, m):
    xs = {n: torch.randn(m, i, dtype=torch.bfloat16) for n, (o, i) in SHAPES.items()}
    passes = []
    for _ in range(6):
        t0 = time.perf_counter()
        for layer in layers:
            for n, f in layer.items():
                f(xs[n])
        passes.append((time.perf_counter() - t0) / LAYERS * 1e6)
    return statistics.median(passes[1:])


print("rows  int4 us/layer  bf16 us/layer")
with torch.inference_mode():
    for m in (1, 2, 3, 4, 6, 8, 12, 16, 32):
        a, b = [], []
        for _ in range(3):  # interleaved
            a.append(per_layer(int4, m))
            b.append(per_layer(bf16, m))
        print(f"{m:4d}  {statistics.median(a):13.0f}  {statistics.median(b):13.0f}")
