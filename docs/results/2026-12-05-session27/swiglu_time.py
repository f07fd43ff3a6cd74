import torch, time, torch.nn.functional as F
from specserve.layers import paged_attention_ext as p
ext = p._load()
for n in [1, 8, 32, 64]:
    x = torch.randn(n, 3072).to(torch.bfloat16)
    def old(x):
        out = F.silu(x.narrow(1, 0, 1536)); return out.mul_(x.narrow(1, 1536, 1536))
    for name, f in [("aten", old), ("fused", ext.silu_and_mul), ("aten", old), ("fused", ext.silu_and_mul)]:
        for _ in range(50): f(x)
        t = time.perf_counter()
        for _ in range(1000): f(x)
        print(n, name, f"{(time.perf_counter() - t) * 1e3:.1f} us/call")
