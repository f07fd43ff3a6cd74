"""Per-request sampling parameters in vLLM's shape."""

from __future__ import annotations

import json as _json
import math
from dataclasses import dataclass, replace
from typing import Any


@dataclass(slots=True)
class StructuredOutputsParams:
    """Constrain the output (vLLM's StructuredOutputsParams; exactly one field set): a JSON
    schema (a dict or its JSON text), any JSON object, a regex, one of a list of strings, or an
    EBNF grammar in xgrammar's dialect."""

    json: str | dict | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    # JSON only: no whitespace beyond what the separators need (a small model may otherwise
    # fill max_tokens with it).
    disable_any_whitespace: bool = False
    # A reasoning model's end of reasoning ("</think>"): the constraint applies to what follows
    # its first occurrence in the output, the reasoning before it is free (the server sets it
    # under --reasoning-parser, as vLLM constrains only the answer).
    starts_after: str | None = None

    def __post_init__(self) -> None:
        set_fields = [name for name in _CONSTRAINTS if getattr(self, name) not in (None, False)]
        if len(set_fields) != 1:
            raise ValueError("structured_outputs takes exactly one of json, json_object, regex, "
                             f"choice, grammar; got {set_fields or 'none'}")
        if isinstance(self.json, str):
            try:
                _json.loads(self.json)
            except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
                raise ValueError(f"structured_outputs json is not valid JSON: {exc}") from None
        elif self.json is not None and not isinstance(self.json, dict):
            raise ValueError("structured_outputs json must be a JSON schema (a dict or a string)")
        if self.choice is not None and (not isinstance(self.choice, (list, tuple))
                                        or not self.choice
                                        or any(not isinstance(c, str) or not c
                                               for c in self.choice)):
            raise ValueError("structured_outputs choice must be a non-empty list of non-empty "
                             "strings")
        for name in ("regex", "grammar", "starts_after"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs {name} must be a non-empty string")

    @property
    def kind(self) -> str:
        return next(name for name in _CONSTRAINTS if getattr(self, name) not in (None, False))


_CONSTRAINTS = ("json", "json_object", "regex", "choice", "grammar")


_FLOAT32_MAX = 3.4028234663852886e38


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    """An integer, True and False not counted (Python's bool is an int: n=True would be 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(slots=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0  # drop tokens less likely than min_p x the likeliest (0: disabled)
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # return the sampled token's logprob (and this many top ones)
    # Each prompt token's logprob given the tokens before it (and this many top ones), as
    # vLLM's: scoring a text (lm-eval's loglikelihood, the server's echo). Such a request reads
    # no prompt KV from the prefix cache: a cached position produces no logits.
    prompt_logprobs: int | None = None
    # vLLM's: keep only the prompt's last k tokens (left truncation; -1: the model's context),
    # e.g. a chat history that outgrew the context.
    truncate_prompt_tokens: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Speculation override for this request: None = engine default, 0 = off, else K_max.
    num_speculative_tokens: int | None = None
    # "off": no drafts for this request; "static": always its K_max; None or "adaptive": the
    # engine's policy decides (the controller, under the default adaptive policy; an engine
    # built with another policy has no cost model to decide one request by).
    speculation_policy: str | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # vLLM's / OpenAI's logit processing (sample/penalties.py).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    # vLLM's: the only tokens that may be emitted; words (strings) that may not be
    # (sample/token_bans.py).
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    # vLLM's: requests share cached prompt KV only with requests of the same salt (a tenant's
    # prompts stay out of another's prefix-cache hits and their timing).
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None and not isinstance(self.stop, (list, tuple)):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        self.stop = list(self.stop or [])
        if self.stop_token_ids is not None and not isinstance(self.stop_token_ids, (list, tuple)):
            raise ValueError(f"stop_token_ids must be a list of integers, got "
                             f"{self.stop_token_ids!r}")
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        if isinstance(self.logit_bias, dict):
            # A copy, with the values as floats (an int does not add to float logits);
            # validate() refuses what is not a number in range.
            self.logit_bias = {t: float(v) if _is_number(v) and -100 <= v <= 100 else v
                               for t, v in self.logit_bias.items()}
        self.validate()

    def validate(self) -> None:
        def bad(msg: str) -> None:
            raise ValueError(msg)

        if not _is_int(self.n) or self.n < 1:
            bad(f"n must be an integer >= 1, got {self.n!r}")
        if not isinstance(self.temperature, (int, float)) or not 0 <= self.temperature < math.inf:
            bad(f"temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:  # NaN fails too
            bad(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            bad(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            bad(f"top_k must be -1, 0 (disabled) or a positive integer, got {self.top_k!r}")
        if self.max_tokens is not None and (not _is_int(self.max_tokens)
                                            or self.max_tokens < 1):
            bad(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            bad(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if self.logprobs is not None and (not _is_int(self.logprobs)
                                          or not 0 <= self.logprobs <= 20):
            bad(f"logprobs must be in 0..20, got {self.logprobs!r}")
        k = self.truncate_prompt_tokens
        if k is not None and (not _is_int(k) or k < 1 and k != -1):
            bad(f"truncate_prompt_tokens must be an integer >= 1 or -1, got {k!r}")
        if self.prompt_logprobs is not None and (not _is_int(self.prompt_logprobs)
                                                 or not 0 <= self.prompt_logprobs <= 20):
            bad(f"prompt_logprobs must be in 0..20, got {self.prompt_logprobs!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad("stop must be a non-empty string or a list of non-empty strings")
        if any(not _is_int(t) or t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids must be non-negative integers")
        if self.seed is not None and (not _is_int(self.seed)
                                      or not -2**63 <= self.seed < 2**64):
            bad(f"seed must be an integer in [-2**63, 2**64), got {self.seed!r}")
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                bad(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.speculation_policy not in (None, "off", "static", "adaptive"):
            bad("speculation_policy must be one of off, static, adaptive, got "
                f"{self.speculation_policy!r}")
        k = self.num_speculative_tokens
        if k is not None and (not _is_int(k) or k < 0 or k > 16):
            bad(f"num_speculative_tokens must be in 0..16, got {k!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2 <= value <= 2:
                bad(f"{name} must be in [-2, 2], got {value!r}")
        # vLLM's rule (> 0); past float32's range (~3.4e38) it turned a 0 logit into NaN
        if not _is_number(self.repetition_penalty) or \
                not 0 < self.repetition_penalty <= _FLOAT32_MAX:
            bad(f"repetition_penalty must be > 0 (and finite), got {self.repetition_penalty!r}")
        if self.logit_bias is not None and (
                not isinstance(self.logit_bias, dict)
                or any(not _is_int(t) or t < 0 for t in self.logit_bias)
                or any(not isinstance(v, float) or not -100 <= v <= 100
                       for v in self.logit_bias.values())):
            bad("logit_bias must map token ids (integers >= 0) to numbers in [-100, 100]")
        if self.allowed_token_ids is not None and (
                not isinstance(self.allowed_token_ids, (list, tuple)) or not self.allowed_token_ids
                or any(not _is_int(t) or t < 0 for t in self.allowed_token_ids)):
            bad("allowed_token_ids must be a non-empty list of token ids (integers >= 0)")
        if self.bad_words is not None and (
                not isinstance(self.bad_words, (list, tuple))
                or any(not isinstance(w, str) or not w.strip() for w in self.bad_words)):
            bad("bad_words must be a list of non-blank strings")
        if self.cache_salt is not None and (not isinstance(self.cache_salt, str)
                                            or not self.cache_salt):
            bad("cache_salt must be a non-empty string")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs,
                                                                  StructuredOutputsParams):
            bad("structured_outputs must be a StructuredOutputsParams")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < 1e-5

    def for_choice(self, j: int) -> SamplingParams:
        """Choice j of n, run as an engine request of its own (the engine runs one sequence per
        request; LLM.generate and the server fan n out): n = 1, and a seeded request gives
        choice j the seed + j, so that the choices differ and each is reproducible. Only choice
        0 scores the prompt (prompt_logprobs: the scores are the same for all, and a scoring
        request may not read the prefix cache, so the others share choice 0's prefill)."""
        seed = None if self.seed is None else (self.seed + j) & (2**64 - 1)
        return replace(self, n=1, seed=seed,
                       prompt_logprobs=self.prompt_logprobs if j == 0 else None)
