"""Paged attention kernel, SmolLM2-135M shapes (9 heads / 3 KV heads, head_dim 64, 30 layers),
decode (one query per sequence), context 192, shuffled block tables, 2 threads:
  cold: 30 layers' pools, each once (what a decode step does);
  hot:  one layer's pool 30 times (5-9 MB, past L2);
  l2:   every sequence reads the same 12 blocks (147 KB, L2-resident): the arithmetic alone.
Medians of 9 passes. Run from the checkout whose kernel you want to time."""
import statistics
import time

import torch

from specserve.layers import paged_attention_ext as pe

m = pe.module()
H, KVH, D, BS, L = 9, 3, 64, 16, 30
empty = torch.empty(0, dtype=torch.bfloat16)
torch.set_num_threads(2)
for conc, ctx in ((64, 192),):
    bpe = (ctx + BS - 1) // BS
    nb = conc * bpe + 8
    g = torch.Generator().manual_seed(0)
    caches = [(torch.randn(nb * BS, KVH, D, generator=g).bfloat16(),
               torch.randn(nb * BS, KVH, D, generator=g).bfloat16()) for _ in range(L)]
    bt = torch.randperm(nb, generator=g)[: conc * bpe].view(conc, bpe).to(torch.int32).contiguous()
    bt_l2 = bt[:1].repeat(conc, 1).contiguous()
    ts = torch.arange(conc, dtype=torch.int32)
    tp = torch.full((conc,), ctx - 1, dtype=torch.int32)
    q = torch.randn(conc, H, D).bfloat16()

    def run(pools, table):
        t = time.perf_counter()
        for k, v in pools:
            m.paged_attention_short(q, k, v, table, ts, tp, BS, 0.125, 0, empty, empty, 0)
        return time.perf_counter() - t

    import os
    if os.environ.get("L2ONLY"):
        for _ in range(400): run([caches[0]] * L, bt_l2)
        raise SystemExit
    res = {"cold": [], "hot": [], "l2": []}
    for _ in range(9):
        res["cold"].append(run(caches, bt))
        res["hot"].append(run([caches[0]] * L, bt))
        res["l2"].append(run([caches[0]] * L, bt_l2))
    mb = conc * ctx * KVH * D * 2 * 2 * L / 1e6
    print(f"{conc} sequences, context {ctx}, {mb:.0f} MB of K/V: "
          + ", ".join(f"{k} {statistics.median(v) * 1e3:.2f} ms" for k, v in res.items()))
