"""A model's own default sampling parameters, from its generation_config.json.

Model authors ship the sampling they tuned for (Llama 3.1 Instruct: temperature 0.6, top_p 0.9;
Qwen2.5 Instruct: also top_k 20 and repetition_penalty 1.05). vLLM applies them by default
(`--generation-config auto`) to every request that does not set the parameter itself, and reads
`max_new_tokens` as the default (and cap) of max_tokens; so do we. Every value the file sets
counts, as transformers 5 reads it (its own defaults are unset; transformers 4 dropped a value
equal to its default, so a file spelling out top_k 50 set nothing there).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger("specserve")

# generation_config.json key -> SamplingParams field
_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
         "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
# vLLM's value for "ignore the model's file".
ENGINE_DEFAULTS = "vllm"


def read_sampling_defaults(folder: str | Path) -> dict[str, float | int]:
    """The SamplingParams fields the folder's generation_config.json sets; {} without a file."""
    path = Path(folder).expanduser() / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    found: dict[str, float | int] = {}
    for key, name in _KEYS.items():
        value = data.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{path}: {key} must be a number, got {value!r}")
        found[name] = int(value) if name in ("top_k", "max_tokens") else float(value)
    return found


def resolve_sampling_defaults(setting: str, model_path: str | None) -> dict[str, float | int]:
    """`setting` is "auto" (the model directory's file), "vllm" (none) or another folder."""
    if setting == ENGINE_DEFAULTS:
        return {}
    if setting == "auto":
        folder = model_path
    elif Path(setting).expanduser().is_dir():
        folder = setting
    else:
        raise ValueError(f"generation_config must be 'auto', '{ENGINE_DEFAULTS}' or a folder "
                         f"holding generation_config.json, got {setting!r}")
    defaults = read_sampling_defaults(folder) if folder else {}
    if defaults:
        logger.warning("default sampling parameters from %s/generation_config.json: %s (a "
                       "request's own values win; --generation-config %s ignores the file)",
                       folder, defaults, ENGINE_DEFAULTS)
    return defaults
