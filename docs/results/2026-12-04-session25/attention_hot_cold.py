"""Paged attention: 30 different (cold) layers vs one layer 30 times (hot). SmolLM2 shapes."""
import time, statistics, torch
from specserve.layers import paged_attention_ext as pe
m = pe.module()
H, KVH, D, BS, L = 9, 3, 64, 16, 30
empty = torch.empty(0, dtype=torch.bfloat16)
for conc, ctx, qlen in ((32, 192, 1), (64, 192, 1)):
    bpe = (ctx + BS - 1) // BS
    nb = conc * bpe + 8
    g = torch.Generator().manual_seed(0)
    caches = [(torch.randn(nb * BS, KVH, D, generator=g).bfloat16(), torch.randn(nb * BS, KVH, D, generator=g).bfloat16()) for _ in range(L)]
    bt = torch.randperm(nb, generator=g)[: conc * bpe].view(conc, bpe).to(torch.int32).contiguous()
    ts = torch.arange(conc, dtype=torch.int32).repeat_interleave(qlen)
    tp = torch.cat([torch.arange(ctx - qlen, ctx, dtype=torch.int32) for _ in range(conc)])
    q = torch.randn(conc * qlen, H, D).bfloat16()
    res = {"cold": [], "hot": []}
    for r in range(9):
        t = time.perf_counter()
        for k, v in caches:
            m.paged_attention_short(q, k, v, bt, ts, tp, BS, 0.125, 0, empty, empty, 0)
        res["cold"].append(time.perf_counter() - t)
        k, v = caches[0]
        t = time.perf_counter()
        for _ in range(L):
            m.paged_attention_short(q, k, v, bt, ts, tp, BS, 0.125, 0, empty, empty, 0)
        res["hot"].append(time.perf_counter() - t)
    mb = conc * ctx * KVH * D * 2 * 2 * L / 1e6
    print(f"conc {conc} ctx {ctx}: KV {mb:.0f} MB; cold {statistics.median(res['cold'])*1e3:.2f} ms, hot {statistics.median(res['hot'])*1e3:.2f} ms")
