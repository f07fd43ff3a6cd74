"""A converted copy of a GGUF file, so that only its first load pays for gguf's reader.

Why: `gguf.GGUFReader` parses the 49k-entry vocabulary and merge list field by field, which
takes ~4.7 s on a 2-core Zen 3, and dequantizing the tensors another ~2 s; every engine start
(a benchmark lab builds one per strategy, the test suite dozens) paid both. The copy holds what
the loader produced: our fp32 state dict (Q/K already un-permuted and fused), the raw quantized
rows and the model config, as one safetensors file (~0.6 GB for the embedded model) that loads
in well under a second. It is keyed by the GGUF's path, size and mtime and by CONVERTER_VERSION
(raise it whenever load_gguf's output changes), and lives in $SPECSERVE_CACHE/models
(default ~/.cache/specserve). A cache that cannot be written only costs the speed-up.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from specserve.config import ModelConfig

# 2: a scaled rope and tensors without a place are refused; 3: eot / eom ids stop too
CONVERTER_VERSION = 3
_RAW = "raw::"  # key prefix of the raw quantized rows (uint8) in the safetensors file


def cache_path(gguf_path: str, cache_root: Path) -> Path:
    stat = os.stat(gguf_path)
    key = f"{os.path.abspath(gguf_path)}:{stat.st_size}:{stat.st_mtime_ns}:{CONVERTER_VERSION}"
    return cache_root / "models" / (hashlib.sha1(key.encode()).hexdigest()[:16] + ".safetensors")


def load_converted(
    gguf_path: str, cache_root: Path, convert: Callable[[], tuple[ModelConfig, dict, dict]]
) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, tuple[np.ndarray, str]]]:
    """(config, fp32 state dict, raw quantized rows) of a GGUF: from the cached copy when there
    is one, else from `convert()`, whose result is then saved."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    target = cache_path(gguf_path, cache_root)
    if target.is_file():
        try:
            with safe_open(str(target), framework="pt") as f:
                meta = f.metadata()
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            cfg_fields = json.loads(meta["config"])
            cfg_fields["eos_token_ids"] = tuple(cfg_fields["eos_token_ids"])
            cfg_fields["rope_scaling"] = tuple(map(tuple, cfg_fields.get("rope_scaling", ())))
            raw_types = json.loads(meta["raw_types"])
            raw = {n: (tensors.pop(_RAW + n).numpy(), qtype) for n, qtype in raw_types.items()}
            return ModelConfig(**cfg_fields), tensors, raw
        except (OSError, KeyError, ValueError, TypeError):
            pass  # a partial or foreign file: convert again and overwrite it
    cfg, sd, raw = convert()
    tensors = {k: v.contiguous() for k, v in sd.items()}
    tensors.update({_RAW + n: torch.from_numpy(np.array(rows))  # a writable copy
                    for n, (rows, _) in raw.items()})
    meta = {"config": json.dumps(dataclasses.asdict(cfg)),
            "raw_types": json.dumps({n: qtype for n, (_, qtype) in raw.items()})}
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, target)  # atomic: a concurrent reader sees the old file or the new one
    except OSError:
        tmp.unlink(missing_ok=True)
    return cfg, sd, raw
