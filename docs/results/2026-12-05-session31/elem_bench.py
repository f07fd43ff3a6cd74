import time, torch
from specserve.layers import paged_attention_ext
ext = paged_attention_ext.module()
torch.manual_seed(0)
def bench(f, reps=50):
    for _ in range(5): f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[len(ts)//2] * 1e3
for n in (64, 2048):
    x = torch.randn(n, 576).bfloat16(); r = torch.randn(n, 576).bfloat16(); w = torch.randn(576).bfloat16()
    gu = torch.randn(n, 3072).bfloat16()
    a = bench(lambda: ext.add_rms_norm_(x, r, w, 1e-5))
    b = bench(lambda: ext.rms_norm(x, w, 1e-5))
    c = bench(lambda: ext.silu_and_mul(gu))
    d = bench(lambda: torch.nn.functional.silu(gu[:, :1536]) * gu[:, 1536:])
    print(f"n={n}: add_rms_norm_ {a:.3f} ms  rms_norm {b:.3f}  silu_and_mul {c:.3f}  aten silu*up {d:.3f}")
