"""Fused CPU paged attention for short queries (decode, speculative verification).

A C++ kernel (csrc/paged_attention.cpp) that reads K/V in place from the paged cache through the
block tables, built once at run time together with the decoder's fused elementwise ops
(csrc/fused_ops.cpp, used through layers/fused.py) and the C++ layer loop (csrc/layer_loop.cpp,
models/layer_loop.py) with `torch.utils.cpp_extension.load_inline`
(needs a C++ compiler and ninja). The build goes to `$SPECSERVE_CACHE/torch_extensions/<name>`
(default `~/.cache/specserve/torch_extensions/<name>`); `<name>` hashes the sources, the compiler
flags, the compiler, torch and Python versions and the CPU (vendor, family/model/stepping, model
name, ISA flags), because `-march=native` code must never be loaded on another CPU.

`available()` builds or loads the extension on first use and says whether it can be used;
`SPECSERVE_NO_EXT=1` turns it off. Callers keep the pure-PyTorch path as the fallback.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

_SOURCE_PATHS = [Path(__file__).with_name("csrc") / f
                 for f in ("amx_tiles.cpp", "paged_attention.cpp", "fused_ops.cpp",
                           "bf16_gemv.cpp", "argmax.cpp", "amx_linear.cpp", "layer_loop.cpp")]
_FUNCTIONS = ["paged_attention_short", "rms_norm", "add_rms_norm_", "rope_write_kv",
              "silu_and_mul", "argmax_rows", "bf16_linear", "bf16_linear_vectorized",
              "bf16_linear_max_rows", "amx_linear", "amx_linear_available",
              "amx_linear_max_rows", "register_layer_plan", "free_layer_plan", "run_layer_plan"]
_CFLAGS = [
    "-O3",
    "-march=native",
    "-fopenmp",  # at::parallel_for expands to `#pragma omp parallel` in the headers
    # Let gcc reassociate fp32 reductions (dot products, sums, max) so that it vectorises them.
    "-fno-trapping-math",
    "-fno-signed-zeros",
    "-fassociative-math",
    "-fno-math-errno",
    "-mprefer-vector-width=512",
]
_LDFLAGS = ["-fopenmp"]
_STALE_LOCK_S = 600.0

_lock = threading.Lock()
_module: Any = None
_tried = False
build_seconds: float | None = None  # wall time of the build or load in this process


def _cpu_id() -> str:
    """A description of the CPU that changes whenever `-march=native` could produce other code."""
    parts = [platform.machine(), platform.processor()]
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        first = text.split("\n\n", 1)[0]
        keys = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags",
                "Features", "CPU implementer", "CPU part", "CPU variant")
        for line in first.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in keys:
                parts.append(f"{key.strip()}={value.strip()}")
    except OSError:
        pass
    return "|".join(parts)


def _compiler() -> str | None:
    cxx = os.environ.get("CXX", "c++")
    path = shutil.which(cxx)
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0] if out.stdout else path
    except (OSError, subprocess.SubprocessError):
        return None


def _ensure_ninja() -> bool:
    if shutil.which("ninja"):
        return True
    try:  # the `ninja` wheel; its binary is not on PATH when the venv is not activated
        import ninja  # type: ignore[import-not-found]

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    except ImportError:
        return False
    return shutil.which("ninja") is not None


def extension_name(source: str, compiler: str) -> str:
    key = "\n".join([
        source, " ".join(_CFLAGS), " ".join(_LDFLAGS), compiler, torch.__version__,
        sys.version, _cpu_id(),
    ])
    return "specserve_cpu_ops_" + hashlib.sha256(key.encode()).hexdigest()[:16]


def _build() -> Any:
    global build_seconds
    from torch.utils.cpp_extension import load_inline

    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX or install g++)")
    if not _ensure_ninja():
        raise RuntimeError("ninja not found (pip install ninja)")
    source = "\n".join(p.read_text() for p in _SOURCE_PATHS)
    name = extension_name(source, compiler)
    root = os.environ.get("SPECSERVE_CACHE", os.path.join(Path.home(), ".cache", "specserve"))
    build_dir = Path(root) / "torch_extensions" / name
    build_dir.mkdir(parents=True, exist_ok=True)
    # torch waits forever on the lock file of a build that was killed; a build takes ~10-50 s.
    lock = build_dir / "lock"
    try:
        if time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
            logger.warning("removing stale extension build lock %s", lock)
            lock.unlink(missing_ok=True)
    except FileNotFoundError:
        pass
    t0 = time.perf_counter()
    module = load_inline(
        name=name,
        cpp_sources=[source],
        functions=_FUNCTIONS,
        extra_cflags=_CFLAGS,
        extra_ldflags=_LDFLAGS,
        build_directory=str(build_dir),
        no_implicit_headers=True,  # the source includes only what it needs (faster build)
        verbose=False,
    )
    build_seconds = time.perf_counter() - t0
    logger.debug("paged attention extension %s ready in %.1f s", name, build_seconds)
    return module


def _load() -> Any:
    global _module, _tried
    if _tried:
        return _module
    with _lock:
        if not _tried:
            try:
                _module = _build()
            except Exception as e:  # compiler missing, build error, load error
                logger.warning("fused paged attention kernel unavailable (%s: %s); "
                               "using the PyTorch path", type(e).__name__, e)
                _module = None
            _tried = True
    return _module


def module() -> Any:
    """The loaded extension (all its ops), or None when it is unavailable or switched off.
    Called per op per layer, so the loaded case returns at once."""
    if _tried:
        return _module
    return _load() if available() else None


def available() -> bool:
    """Whether the fused kernel can be used (builds or loads it on the first call)."""
    if os.environ.get("SPECSERVE_NO_EXT", "") not in ("", "0"):
        return False
    return _load() is not None


def paged_attention_short(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    token_seq: torch.Tensor,
    token_pos: torch.Tensor,
    block_size: int,
    scale: float,
    *,
    max_parts: int = 0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    kv_format: int = 0,
) -> torch.Tensor:
    """Causal attention of a few query tokens per sequence over the paged KV cache.

    q: [num_tokens, num_heads, head_dim] bf16/fp32; k_cache, v_cache: [num_slots, num_kv_heads,
    head_dim] of q's dtype, or 8-bit (kv_format 1: int8, 2: fp8 e4m3 stored as uint8) with
    k_scale, v_scale [num_slots, num_kv_heads(, 1)] bf16 (cached value = value * scale);
    block_tables: [num_seqs, max_blocks] int32 contiguous; token_seq, token_pos: [num_tokens]
    int32 (row of block_tables; absolute position; the token attends to keys 0..token_pos
    inclusive, its own K/V already in the cache). Slot of position p of sequence s:
    block_tables[s, p // block_size] * block_size + p % block_size. GQA: head h reads KV head
    h // (num_heads // num_kv_heads). Returns [num_tokens, num_heads * head_dim] in q's dtype.

    Consecutive tokens of one sequence (up to 16) form one work item and share each K/V load,
    so keep a sequence's query tokens adjacent. The GIL is released while the kernel runs.

    max_parts: cap on key partitions per sequence (0: automatic, used when there are fewer than
    4 sequences per thread and long contexts; 1: never split).
    """
    module = _module if _tried else _load()
    if module is None:
        raise RuntimeError("fused paged attention kernel is not available")
    # No conversions here: this runs once per layer per step, and the kernel checks dtypes and
    # layouts itself (metadata must already be int32).
    return module.paged_attention_short(
        q.contiguous(), k_cache, v_cache, block_tables, token_seq, token_pos, block_size, scale,
        max_parts, _NO_SCALE if k_scale is None else k_scale,
        _NO_SCALE if v_scale is None else v_scale, kv_format)


_NO_SCALE = torch.empty(0, dtype=torch.bfloat16)  # the kernel's "no scales" (unquantized pools)
