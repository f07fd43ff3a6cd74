"""AMX linear over SmolLM2-135M's linears: cold (every weight, in order) vs hot (layer 0's
weights 30 times, plus the LM head) at 1-64 rows. Medians of 7."""
import time, torch
from specserve.layers import linear
ext = linear.paged_attention_ext.module()
torch.manual_seed(0)
layer = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
shapes = layer * 30 + [(49152, 576)]
ws = [linear.amx_pack_weight((torch.randn(n, k) * 0.05).bfloat16()) for n, k in shapes]
hot = ws[:4] * 30 + [ws[-1]]
small = ws[:4] * 30
empty = torch.empty(0)
def run(ps, xs):
    for p, x in zip(ps, xs):
        ext.amx_linear(x, p, empty)
for rows in (1, 16, 32, 48, 64):
    xs = [torch.randn(rows, k).bfloat16() for n, k in shapes]
    t = {"cold": [], "hot": [], "layers-hot": []}
    for _ in range(8):
        for name, ps in (("cold", ws), ("hot", hot), ("layers-hot", small)):
            s = time.perf_counter(); run(ps, xs if name != "layers-hot" else xs[:-1]); t[name].append(time.perf_counter() - s)
    print(f"rows {rows:2d} " + "  ".join(f"{k} {sorted(v[1:])[3]*1e3:6.2f}" for k, v in t.items()), flush=True)
