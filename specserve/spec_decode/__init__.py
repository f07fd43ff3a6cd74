"""Speculative decoding: proposers (one per file) and the policy that picks K per request."""

from __future__ import annotations

import torch

from specserve.config import EngineConfig
from specserve.spec_decode.config import SpeculativeConfig
from specserve.spec_decode.proposer import Proposer


def build_proposer(spec: SpeculativeConfig | None, config: EngineConfig, tokenizer,
                   block_size: int, target_embedding: torch.nn.Embedding | None = None,
                   target_head: torch.Tensor | None = None, target_cfg=None) -> Proposer | None:
    """target_embedding, target_head, target_cfg: the target's input embedding module, LM head
    weight and config, which a trained draft or an EAGLE head shares."""
    if spec is None:
        return None
    if spec.method == "ngram":
        from specserve.spec_decode.ngram import NgramProposer

        return NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max)
    if spec.method == "suffix":
        from specserve.spec_decode.suffix import SuffixProposer

        return SuffixProposer(spec)
    if spec.method == "eagle":
        from specserve.spec_decode.eagle import EagleProposer

        if spec.model is None:
            raise ValueError('the eagle method needs "model": a head trained by '
                             "`specserve train-draft --method eagle`")
        if spec.quantization is not None:
            raise ValueError("an EAGLE head runs in the engine's dtype; quantization of the "
                             "head is not supported")
        return EagleProposer(spec.model, target_cfg, target_embedding, target_head, tokenizer,
                             config.torch_dtype, block_size, spec.kv_cache_memory)
    from specserve.spec_decode.draft_model import DraftModelProposer

    weight = None if target_embedding is None else target_embedding.weight
    return DraftModelProposer(spec, config.model, tokenizer, config.torch_dtype, block_size,
                              target_embedding=weight, device=config.device,
                              target_vocab_size=None if target_cfg is None
                              else target_cfg.vocab_size)
