"""attention_tiers.py for bf16, int8 and fp8 pools (64 sequences, context 192)."""
import statistics, time, sys, torch
from specserve.layers import paged_attention_ext as pe
from specserve.layers.kv_cache import quantize_kv
m = pe.module()
H, KVH, D, BS, L = 9, 3, 64, 16, 30
torch.set_num_threads(2)
conc, ctx = 64, 192
bpe = ctx // BS; nb = conc * bpe + 8
g = torch.Generator().manual_seed(0)
bt = torch.randperm(nb, generator=g)[: conc * bpe].view(conc, bpe).to(torch.int32).contiguous()
bt_l2 = bt[:1].repeat(conc, 1).contiguous()
ts = torch.arange(conc, dtype=torch.int32); tp = torch.full((conc,), ctx - 1, dtype=torch.int32)
q = torch.randn(conc, H, D).bfloat16()
for kvd in sys.argv[1:]:
    pools = []
    for _ in range(L):
        k = torch.randn(nb * BS, KVH, D, generator=g); v = torch.randn(nb * BS, KVH, D, generator=g)
        if kvd == "bf16":
            e = torch.empty(0, dtype=torch.bfloat16)
            pools.append((k.bfloat16(), v.bfloat16(), e, e, 0))
        else:
            dt = torch.int8 if kvd == "int8" else torch.float8_e4m3fn
            kq, ks = quantize_kv(k, dt); vq, vs = quantize_kv(v, dt)
            st = (lambda t: t) if kvd == "int8" else (lambda t: t.view(torch.uint8))
            pools.append((st(kq), st(vq), ks, vs, 1 if kvd == "int8" else 2))
    def run(ps, table):
        t = time.perf_counter()
        for k, v, ks, vs, f in ps:
            m.paged_attention_short(q, k, v, table, ts, tp, BS, 0.125, 0, ks, vs, f)
        return time.perf_counter() - t
    res = {"cold": [], "l2": []}
    for _ in range(7):
        res["cold"].append(run(pools, bt)); res["l2"].append(run([pools[0]] * L, bt_l2))
    print(kvd, ", ".join(f"{k} {statistics.median(v)*1e3:.2f} ms" for k, v in res.items()), flush=True)
