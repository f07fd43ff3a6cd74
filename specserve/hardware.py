"""What the machine runs fast, asked once: the engine's precision and kernels follow from it.

bf16 GEMMs on a CPU need hardware. oneDNN packs and runs bf16 weights only where the CPU has
AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT; on an AVX2-only CPU (an AMD Zen 3, say) torch's bf16
matmul falls back to a slow generic path: 15 GFLOP/s against 100-140 for fp32 on a 2-core
Zen 3 (docs/performance.md, "CPUs without bf16 GEMMs"). So `dtype="auto"` means bf16 where bf16
GEMMs are native (and on CUDA) and fp32 elsewhere (config.parse_dtype), and an explicit bf16 on
such a CPU computes its matmuls from an fp32 copy of the bf16 weights (layers/linear.py).
"""

from __future__ import annotations

from functools import cache

import torch


@cache
def cpu_has_bf16_gemm() -> bool:
    """Whether oneDNN can pack (and so run natively) bf16 linear weights on this CPU. Probed by
    packing a tiny weight: the op raises where the ISA is missing."""
    if not (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), 1)
    except RuntimeError:
        return False
    return True


@cache
def cpu_can_pack_fp32() -> bool:
    """Whether oneDNN can pack fp32 linear weights here (any x86-64 with AVX2 can)."""
    if not (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16), 1)
    except RuntimeError:
        return False
    return True


def describe_cpu_precision() -> str:
    """One line for logs and benchmark records: which GEMM precisions run natively."""
    bf16 = "native" if cpu_has_bf16_gemm() else "emulated (fp32 copies of the weights)"
    return f"bf16 GEMMs {bf16}; torch CPU capability {torch.backends.cpu.get_cpu_capability()}"
