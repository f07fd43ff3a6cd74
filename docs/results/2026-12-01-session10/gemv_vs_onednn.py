"""The bf16 small-row kernel (csrc/bf16_gemv.cpp) against oneDNN packed bf16, 30 layers of SmolLM2 weights,
cold, 2 threads. Run: .venv/bin/python docs/results/2026-12-01-session10/gemv_vs_onednn.py (~1 min)"""
import time, torch
from specserve.layers import paged_attention_ext as ext
torch.set_num_threads(2)
m = ext.module()
print("vectorized:", m.bf16_linear_vectorized(), "max rows", m.bf16_linear_max_rows())
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
torch.manual_seed(0)
layers = [[torch.randn(n, k).bfloat16() for n, k in shapes] for _ in range(30)]
packed = [[torch.ops.mkldnn._reorder_linear_weight(w, 32) for w in ws] for ws in layers]
op = torch.ops.mkldnn._linear_pointwise.default
nbytes = sum(w.nbytes for ws in layers for w in ws)
empty = torch.empty(0)
def run(fn, rows):
    xs = {k: torch.randn(rows, k).bfloat16() for _, k in shapes}
    for _ in range(2): fn(xs)
    best = float("inf")
    for _ in range(7):
        t = time.perf_counter(); fn(xs); best = min(best, time.perf_counter() - t)
    return best
def kernel(xs):
    for ws in layers:
        for w in ws: m.bf16_linear(xs[w.shape[1]], w, empty)
def onednn(xs):
    for ws, ps in zip(layers, packed):
        for w, p in zip(ws, ps): op(xs[w.shape[1]], p, None, "none", [], "")
print(f"{'rows':>4} {'kernel ms':>10} {'GB/s':>6} {'oneDNN bf16 ms':>15} {'GB/s':>6}")
for rows in (1, 2, 4, 8, 12, 16, 32):
    a, b = run(kernel, rows), run(onednn, rows)
    print(f"{rows:>4} {a*1e3:>10.2f} {nbytes/a/1e9:>6.1f} {b*1e3:>15.2f} {nbytes/b/1e9:>6.1f}")
