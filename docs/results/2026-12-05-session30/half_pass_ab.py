import time, torch
from specserve.layers import linear
ext = linear.paged_attention_ext.module()
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
amx = [linear.amx_pack_weight((torch.randn(n, k) * 0.05).bfloat16()) for n, k in shapes]
e = torch.empty(0)
out = []
for rows in (48, 65, 80, 112, 144):
    xs = [torch.randn(rows, k).bfloat16() for n, k in shapes]
    for p, x in zip(amx, xs): ext.amx_linear(x, p, e)
    t = []
    for _ in range(7):
        s = time.perf_counter()
        for p, x in zip(amx, xs): ext.amx_linear(x, p, e)
        t.append(time.perf_counter() - s)
    out.append(f"{rows}:{sorted(t)[3]*1e3:.2f}")
print(" ".join(out))
