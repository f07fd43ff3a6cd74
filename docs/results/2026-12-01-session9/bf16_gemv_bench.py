"""The bf16 small-row kernel (csrc/bf16_gemv.cpp) against oneDNN fp32 on the weights' fp32
image, on SmolLM2-135M's 30 layers of weights (cold: each call reads weights from DRAM, as a
forward does) at 1..32 rows, 2 threads. Run:
  .venv/bin/python docs/results/2026-12-01-session9/bf16_gemv_bench.py   (~1 min)"""

import time

import torch

from specserve.layers import paged_attention_ext as ext

torch.set_num_threads(2)
m = ext.module()
print("vectorized:", m.bf16_linear_vectorized())
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down
torch.manual_seed(0)
layers = [[torch.randn(n, k).bfloat16() for n, k in shapes] for _ in range(30)]
images = [[torch.ops.mkldnn._reorder_linear_weight(w.float(), 32) for w in ws] for ws in layers]
op = torch.ops.mkldnn._linear_pointwise.default
nbytes = sum(w.nbytes for ws in layers for w in ws)
empty = torch.empty(0)


def run(fn, rows):
    xs = {k: torch.randn(rows, k).bfloat16() for _, k in shapes}
    for _ in range(2):
        fn(xs)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        fn(xs)
        best = min(best, time.perf_counter() - t)
    return best


def kernel(xs):
    for ws in layers:
        for w in ws:
            m.bf16_linear(xs[w.shape[1]], w, empty)


def image(xs):
    for ws, ps in zip(layers, images):
        for w, p in zip(ws, ps):
            op(xs[w.shape[1]].float(), p, None, "none", [], "").bfloat16()


print(f"{'rows':>4} {'kernel ms':>10} {'GB/s':>6} {'fp32 image ms':>14} {'speed-up':>8}")
for rows in (1, 2, 4, 8, 12, 16, 24, 32):
    a, b = run(kernel, rows), run(image, rows)
    print(f"{rows:>4} {a * 1e3:>10.2f} {nbytes / a / 1e9:>6.1f} {b * 1e3:>14.2f} {b / a:>8.2f}")
# exactness against float64
x = torch.randn(5, 576).bfloat16()
w = layers[0][0]
ref = (x.double() @ w.double().T)
got = m.bf16_linear(x, w, empty).double()
print("max rel err vs float64:", ((got - ref).abs() / ref.abs().clamp(min=1e-3)).max().item())
