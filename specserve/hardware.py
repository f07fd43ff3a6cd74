"""What the machine runs fast, asked once: the engine's precision and kernels follow from it.

bf16 GEMMs on a CPU need hardware. oneDNN packs and runs bf16 weights only where the CPU has
AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT; on an AVX2-only CPU (an AMD Zen 3, say) torch's bf16
matmul falls back to a slow generic path: 15 GFLOP/s against 100-140 for fp32 on a 2-core
Zen 3 (docs/performance.md, "CPUs without bf16 GEMMs"). There a bf16 layer runs as an oneDNN
fp32 GEMM on the exact fp32 image of its weight, and reads the bf16 weight itself with our
AVX2 kernel when only a few rows come (layers/linear.py): as fast as fp32 for prefill, 1.6-2x
faster for decoding, which reads half the bytes. So `dtype="auto"` (config.parse_dtype) is bf16
on CUDA, on CPUs with native bf16 GEMMs and on CPUs where that kernel runs, and fp32 elsewhere.
"""

from __future__ import annotations

from functools import cache

import torch


@cache
def _onednn_packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs (and so runs natively) linear weights of this dtype on this CPU.
    Probed by packing a tiny weight: the op raises where the ISA is missing."""
    if not (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), 1)
    except RuntimeError:
        return False
    return True


def cpu_has_bf16_gemm() -> bool:
    """Native bf16 GEMMs: AVX-512 (BW/VL/DQ), AVX-NE-CONVERT or AMX."""
    return _onednn_packs(torch.bfloat16)


def cpu_can_pack_fp32() -> bool:
    """oneDNN-packed fp32 GEMMs (any x86-64 with AVX2)."""
    return _onednn_packs(torch.float32)


@cache
def cpu_runs_bf16_well() -> bool:
    """Whether bf16 beats fp32 on this CPU: native bf16 GEMMs, or fp32 images plus the small-row
    bf16 kernel (built with AVX2 + FMA). Without the kernel an emulated bf16 layer only adds
    conversions to an fp32 GEMM."""
    if cpu_has_bf16_gemm():
        return True
    from specserve.layers.linear import small_rows  # builds or loads the C++ extension

    return cpu_can_pack_fp32() and small_rows() > 0


def describe_cpu_precision() -> str:
    """One line for logs and benchmark records: how bf16 GEMMs run here."""
    if cpu_has_bf16_gemm():
        bf16 = "native"
    elif cpu_runs_bf16_well():
        bf16 = "fp32 images of the weights + the small-row bf16 kernel"
    else:
        bf16 = "fp32 images of the weights (no small-row kernel)"
    return f"bf16 GEMMs: {bf16}; torch CPU capability {torch.backends.cpu.get_cpu_capability()}"
