"""Speculative decoding: proposers (one per file) and the policy that picks K per request."""

from __future__ import annotations

import torch

from specserve.config import EngineConfig
from specserve.spec_decode.config import SpeculativeConfig
from specserve.spec_decode.proposer import Proposer


def build_proposer(spec: SpeculativeConfig | None, config: EngineConfig, tokenizer,
                   block_size: int, target_embedding: torch.Tensor | None = None
                   ) -> Proposer | None:
    """target_embedding: the target's input embedding, which a trained draft shares."""
    if spec is None:
        return None
    if spec.method == "ngram":
        from specserve.spec_decode.ngram import NgramProposer

        return NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max)
    from specserve.spec_decode.draft_model import DraftModelProposer

    return DraftModelProposer(spec, config.model, tokenizer, config.torch_dtype, block_size,
                              target_embedding=target_embedding)
