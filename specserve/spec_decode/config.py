"""Speculative decoding configuration, in vLLM's `speculative_config` shape."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

METHODS = ("ngram", "draft", "eagle", "suffix")


# Each field's type: JSON gives 4.0 or "4" as readily as 4.
_TYPES: dict[str, type | tuple[type, ...]] = {
    "method": str, "model": (str, os.PathLike), "quantization": str,
    "num_speculative_tokens": int, "draft_layers": int, "kv_cache_memory": int,
    "prompt_lookup_min": int, "prompt_lookup_max": int,
    "suffix_decoding_max_tree_depth": int, "suffix_decoding_max_cached_requests": int,
    "suffix_decoding_max_spec_factor": (int, float), "suffix_decoding_min_token_prob": (int, float),
}
_OPTIONAL = ("model", "quantization", "draft_layers", "kv_cache_memory")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int = 4  # K_max
    model: str | None = None  # draft: a model path (default: the target's own weights);
    # eagle: the directory of a head trained by `specserve train-draft --method eagle`
    draft_layers: int | None = None  # self-draft: keep the target's first N layers
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    quantization: str | None = None  # the draft's own weight quantization
    # The draft's own KV pool in bytes, paid from the engine's kv_cache_memory before the
    # target's pool is sized; None: as many tokens as the target's pool, both paid from it.
    kv_cache_memory: int | None = None
    # suffix (vLLM's names): the longest match looked for in earlier replies, how many replies
    # are kept (a full cache forgets its older half at once, so between half and all of them,
    # where vLLM keeps exactly the last ones), at most this many guesses per matched token, and
    # no guess whose estimated chance (the share of matches that continue with it) falls below
    # the minimum.
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1

    def __post_init__(self) -> None:
        # Refused here, not a TypeError in the middle of a step.
        for name, kind in _TYPES.items():
            value = getattr(self, name)
            if value is None and name in _OPTIONAL:
                continue
            if isinstance(value, bool) or not isinstance(value, kind):
                what = "an integer" if kind is int else "a number" if kind == (int, float) \
                    else "a string"
                raise ValueError(f"speculative_config {name} must be {what}, got {value!r}")
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {METHODS}, got {self.method!r}")
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError("num_speculative_tokens must be in 1..16")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        if self.draft_layers is not None and self.draft_layers < 1:
            raise ValueError("draft_layers must be >= 1")
        if self.suffix_decoding_max_tree_depth < 3:
            raise ValueError("suffix_decoding_max_tree_depth must be >= 3")
        if self.suffix_decoding_max_cached_requests < 1:
            raise ValueError("suffix_decoding_max_cached_requests must be >= 1")
        if not 0 < self.suffix_decoding_max_spec_factor < math.inf:
            raise ValueError("suffix_decoding_max_spec_factor must be > 0 and finite")
        if not 0 <= self.suffix_decoding_min_token_prob <= 1:
            raise ValueError("suffix_decoding_min_token_prob must be in [0, 1]")

    @classmethod
    def from_dict(cls, d: dict | SpeculativeConfig | None) -> SpeculativeConfig | None:
        if d is None or isinstance(d, SpeculativeConfig):
            return d
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown speculative_config keys {sorted(unknown)}; "
                             f"known: {sorted(known)}")
        if "method" not in d:
            raise ValueError('speculative_config needs a "method" (ngram, suffix, draft or eagle)')
        return cls(**d)
