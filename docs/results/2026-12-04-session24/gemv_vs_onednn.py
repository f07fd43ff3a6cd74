import time, torch
from specserve.layers import paged_attention_ext
from specserve.layers.linear import _LINEAR_POINTWISE
torch.set_num_threads(2)
ext = paged_attention_ext.module()
print("vectorized", ext.bf16_linear_vectorized(), "max rows", ext.bf16_linear_max_rows())
shapes = []
for _ in range(30):
    shapes += [(576 + 2 * 192, 576), (576, 576), (2 * 1536, 576), (576, 1536)]
shapes.append((49152, 576))
ws = [torch.randn(o, i).to(torch.bfloat16) for o, i in shapes]
packed = [torch.ops.mkldnn._reorder_linear_weight(w, 32) for w in ws]
print(f"weights {sum(w.nbytes for w in ws)/1e6:.0f} MB")
for rows in (1, 2, 4, 8):
    xs = {i: torch.randn(rows, i).to(torch.bfloat16) for i in (576, 1536)}
    res = {}
    for name in ("onednn", "gemv"):
        best = 1e9
        for _ in range(7):
            t = time.perf_counter()
            for w, p, (o, i) in zip(ws, packed, shapes):
                if name == "onednn":
                    _LINEAR_POINTWISE(xs[i], p, None, "none", [], "")
                else:
                    ext.bf16_linear(xs[i], w, torch.empty(0))
            best = min(best, time.perf_counter() - t)
        res[name] = best
    print(f"rows {rows}: onednn {res['onednn']*1e3:.2f} ms  gemv {res['gemv']*1e3:.2f} ms  "
          f"({sum(w.nbytes for w in ws)/res['onednn']/1e9:.1f} / {sum(w.nbytes for w in ws)/res['gemv']/1e9:.1f} GB/s)")
for hint in (1, 4, 64):
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, hint) for w in ws]
    for rows in (1, 32):
        xs = {i: torch.randn(rows, i).to(torch.bfloat16) for i in (576, 1536)}
        best = 1e9
        for _ in range(5):
            t = time.perf_counter()
            for p, (o, i) in zip(packed, shapes):
                _LINEAR_POINTWISE(xs[i], p, None, "none", [], "")
            best = min(best, time.perf_counter() - t)
        print(f"batch_hint {hint} rows {rows}: onednn {best*1e3:.2f} ms")
