"""Time paged_attention_short on prefill shapes (bf16 pools, SmolLM2's 9/3 heads x 64)."""
import sys, time, statistics, torch
sys.path.insert(0, "tests")
from test_paged_attention_ext import make_case
from specserve.layers import paged_attention_ext as ext
torch.set_num_threads(2)
def case(name, ctx, ql, reps):
    q, kc, vc, bt, ts, tp = make_case(ctx, ql, 9, 3, 64, torch.bfloat16, 16, seed=0)
    f = lambda: ext.paged_attention_short(q, kc, vc, bt, ts, tp, 16, 0.125)
    f()
    ts_ = []
    for _ in range(reps):
        t = time.perf_counter(); f(); ts_.append(time.perf_counter() - t)
    print(f"{name:28s} {statistics.median(ts_)*1e3:8.3f} ms (min {min(ts_)*1e3:.3f})", flush=True)
case("16 x 128 prefill", [128]*16, [128]*16, 30)
case("64 x 128 prefill", [128]*64, [128]*64, 10)
case("1 x 2048 prefill", [2048], [2048], 5)
case("512 new over 2048", [2560], [512], 10)
case("32 x verify 6 @192", [192]*32, [6]*32, 50)
case("32 x decode @192", [192]*32, [1]*32, 100)
