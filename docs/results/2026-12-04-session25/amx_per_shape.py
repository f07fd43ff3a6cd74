"""Each SmolLM2 linear shape alone (30 layers of it; the LM head once): oneDNN vs the AMX kernel
at 16-64 rows, medians of 9.  python docs/results/2026-12-04-session25/amx_per_shape.py"""
import time, torch
from specserve.layers import linear
ext = linear.paged_attention_ext.module()
op = torch.ops.mkldnn._linear_pointwise.default
E = torch.empty(0)
torch.manual_seed(0)
for (n, k), reps in (((960, 576), 30), ((576, 576), 30), ((3072, 576), 30), ((576, 1536), 30), ((49152, 576), 1)):
    ws = [(torch.randn(n, k) * 0.05).bfloat16() for _ in range(reps)]
    dn = [torch.ops.mkldnn._reorder_linear_weight(w, 32) for w in ws]
    am = [linear.amx_pack_weight(w) for w in ws]
    line = f"{n}x{k}:"
    for rows in (16, 32, 48, 64):
        x = torch.randn(rows, k).bfloat16()
        td, ta = [], []
        for _ in range(9):
            t = time.perf_counter(); [op(x, p, None, "none", [], "") for p in dn]; td.append(time.perf_counter() - t)
            t = time.perf_counter(); [ext.amx_linear(x, p, E) for p in am]; ta.append(time.perf_counter() - t)
        line += f"  r{rows} dnn {sorted(td)[4]*1e3:.2f} amx {sorted(ta)[4]*1e3:.2f}"
    print(line, flush=True)
