"""A PackedLinear (8192 x 576 bf16, the s27 EAGLE head's LM head shape) past the AMX kernel's
64 rows runs oneDNN, which builds a primitive for every new row count: first call at a row count
against the calls after it."""
import time

import torch

from specserve.layers.linear import PackedLinear

torch.manual_seed(0)
lin = PackedLinear(torch.randn(8192, 576, dtype=torch.bfloat16), None, amx=True)
for m in (65, 66, 80, 97, 65, 80, 130, 131, 130):
    x = torch.randn(m, 576, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    lin(x)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(5):
        lin(x)
    print(f"rows {m}: first call {first * 1e3:.2f} ms, then {(time.perf_counter() - t0) / 5 * 1e3:.3f} ms")
