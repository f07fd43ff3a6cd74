import os, time, torch
torch.set_num_threads(1)
from specserve.layers import paged_attention_ext as p, linear
m = p._load()
w = torch.randn(49152, 576).bfloat16(); wp = linear.amx_pack_weight(w)
x = torch.randn(32, 576).bfloat16()
a = torch.randn(4096, 4096); b = torch.randn(4096, 4096)
for rep in range(3):
    for cpu in (0, 1):
        os.sched_setaffinity(0, {cpu})
        for _ in range(3): m.amx_linear(x, wp, torch.empty(0))
        t = time.perf_counter()
        for _ in range(20): m.amx_linear(x, wp, torch.empty(0))
        tm = (time.perf_counter() - t) / 20 * 1e3
        t = time.perf_counter(); s = 0
        for i in range(3_000_000): s += i
        tc = (time.perf_counter() - t) * 1e3
        print(f"cpu{cpu}: lm-head amx (mem) {tm:.2f} ms, python loop {tc:.0f} ms", flush=True)
