"""The AMX kernel against oneDNN's packed bf16 GEMM on every linear of SmolLM2-135M (30 layers
and the LM head, 269 MB, random weights of the same shapes), rows 1-64, weights cold (the set
is far larger than the caches and is walked in order). Medians of 7 passes, alternated.

    python docs/results/2026-12-04-session25/amx_vs_onednn.py
"""

import time

import torch

from specserve.layers import linear

assert linear.amx_rows(), "no AMX here"
ext = linear.paged_attention_ext.module()
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
ws = [(torch.randn(n, k) * 0.05).bfloat16() for n, k in shapes]
nbytes = sum(w.nbytes for w in ws)
onednn = [torch.ops.mkldnn._reorder_linear_weight(w, 32) for w in ws]
amx = [linear.amx_pack_weight(w) for w in ws]
op = torch.ops.mkldnn._linear_pointwise.default
empty = torch.empty(0)


def run_onednn(xs):
    for p, x in zip(onednn, xs):
        op(x, p, None, "none", [], "")


def run_amx(xs):
    for p, x in zip(amx, xs):
        ext.amx_linear(x, p, empty)


print(f"weights {nbytes / 1e6:.0f} MB")
for rows in (1, 2, 4, 8, 16, 32, 48, 64):
    xs = [torch.randn(rows, w.shape[1]).bfloat16() for w in ws]
    times = {"onednn": [], "amx": []}
    run_onednn(xs), run_amx(xs)  # warm-up
    for _ in range(7):
        for name, fn in (("onednn", run_onednn), ("amx", run_amx)):
            t = time.perf_counter()
            fn(xs)
            times[name].append(time.perf_counter() - t)
    med = {k: sorted(v)[3] * 1e3 for k, v in times.items()}
    print(f"rows {rows:2d}: onednn {med['onednn']:6.2f} ms  amx {med['amx']:6.2f} ms  "
          f"ratio {med['onednn'] / med['amx']:.2f}x  "
          f"({nbytes / med['onednn'] / 1e6:.1f} / {nbytes / med['amx'] / 1e6:.1f} GB/s)",
          flush=True)
