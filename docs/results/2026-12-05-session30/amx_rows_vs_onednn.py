"""The AMX kernel against oneDNN's packed bf16 GEMM over every linear of SmolLM2-135M (random
weights of the same shapes, cold, in order), 48-256 rows; medians of 5 alternated passes.

    python docs/results/2026-12-05-session30/amx_rows_vs_onednn.py
"""
import time, torch
from specserve.layers import linear
ext = linear.paged_attention_ext.module()
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
ws = [(torch.randn(n, k) * 0.05).bfloat16() for n, k in shapes]
onednn = [torch.ops.mkldnn._reorder_linear_weight(w, 32) for w in ws]
amx = [linear.amx_pack_weight(w) for w in ws]
op = torch.ops.mkldnn._linear_pointwise.default
e = torch.empty(0)
def run_o(xs):
    for p, x in zip(onednn, xs): op(x, p, None, "none", [], "")
def run_a(xs):
    for p, x in zip(amx, xs): ext.amx_linear(x, p, e)
for rows in (48, 64, 65, 80, 96, 128, 160, 192, 256):
    xs = [torch.randn(rows, w.shape[1]).bfloat16() for w in ws]
    run_o(xs); run_a(xs)
    t = {"o": [], "a": []}
    for _ in range(5):
        for k, f in (("o", run_o), ("a", run_a)):
            s = time.perf_counter(); f(xs); t[k].append(time.perf_counter() - s)
    o, a = sorted(t["o"])[2] * 1e3, sorted(t["a"])[2] * 1e3
    print(f"rows {rows:3d}: onednn {o:6.2f} ms  amx {a:6.2f} ms  ratio {o / a:.2f}x", flush=True)
