"""torch's int4 CPU kernel (Int4Linear) against the oneDNN-packed bf16 GEMM (PackedLinear) on
SmolLM2-135M's four linear shapes, by rows: "rows:int4/bf16" in us per call, 2 threads.
python int4_rows.py"""
import time, torch
from specserve.quant.int4 import Int4Linear
from specserve.layers.linear import PackedLinear
torch.manual_seed(0)
shapes = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
def t(f, x, n=300):
    for _ in range(20): f(x)
    s = time.perf_counter()
    for _ in range(n): f(x)
    return (time.perf_counter() - s) / n * 1e6
print("threads", torch.get_num_threads())
with torch.inference_mode():
    for name, (o, i) in shapes.items():
        lin = torch.nn.Linear(i, o, bias=False).to(torch.bfloat16)
        q = Int4Linear.from_linear(lin, 32)
        p = PackedLinear(lin.weight, None)
        row = []
        for m in (1, 2, 4, 6, 8, 12, 16, 32, 64):
            x = torch.randn(m, i, dtype=torch.bfloat16)
            row.append(f"{m}:{t(q, x):.0f}/{t(p, x):.0f}")
        print(name, " ".join(row))
