"""Int8LMHead's two paths (the int8 kernel, the packed bf16 GEMM over the same integers) against
the packed bf16 head, by rows, for the target's tied head (49152 rows) and a trained draft's
reduced head (8192 rows). us per call, 2 threads. python int8_head_rows.py"""
import time

import torch

from specserve.layers.linear import PackedLinear
from specserve.quant.lm_head import Int8LMHead


def t(f, x, n=200):
    for _ in range(10):
        f(x)
    s = time.perf_counter()
    for _ in range(n):
        f(x)
    return (time.perf_counter() - s) / n * 1e6


torch.manual_seed(0)
with torch.inference_mode():
    for vocab in (49152, 8192):
        w = torch.randn(vocab, 576) * 0.02
        head = Int8LMHead(w)
        dense = PackedLinear(w.to(torch.bfloat16), None)
        print(f"vocab {vocab}: rows int8-kernel / int8-as-bf16-gemm / bf16 head (us)")
        for m in (1, 2, 3, 4, 6, 8, 12, 16, 32):
            x = torch.randn(m, 576, dtype=torch.bfloat16)
            k = t(lambda v: torch._weight_int8pack_mm(v, head.weight, head.scales), x)
            g = t(lambda v: head._packed(v) * head.scales, x)
            print(f"  {m:3d} {k:8.0f} {g:8.0f} {t(dense, x):8.0f}")
