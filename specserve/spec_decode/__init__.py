"""Speculative decoding: proposers (one per file) and the policy that picks K per request."""

from __future__ import annotations

from specserve.config import EngineConfig
from specserve.engine.request import Request
from specserve.spec_decode.config import SpeculativeConfig
from specserve.spec_decode.proposer import Proposer


def build_proposer(spec: SpeculativeConfig | None, config: EngineConfig, tokenizer,
                   block_size: int) -> Proposer | None:
    if spec is None:
        return None
    if spec.method == "ngram":
        from specserve.spec_decode.ngram import NgramProposer

        return NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max)
    from specserve.spec_decode.draft_model import DraftModelProposer

    return DraftModelProposer(spec, config.model, tokenizer, config.torch_dtype, block_size)


class StaticPolicy:
    """K = the request's own `num_speculative_tokens` if set (0 = off), else the engine's."""

    def __init__(self, spec: SpeculativeConfig | None):
        self.k = spec.num_speculative_tokens if spec else 0

    def num_speculative_tokens(self, req: Request) -> int:
        k = req.params.num_speculative_tokens
        return self.k if k is None else k
