"""The trainable draft: the target's first N layers and final norm (copies), a head over a
subset of the vocabulary, and the target's own embedding (shared, frozen, not a parameter here).

Why the head is trainable: N shallow layers do not produce the final layer's hidden states, so
the copied norm and head are the cheapest place to bridge that gap; the reduced head is the
draft's own copy anyway (V' rows, saved in the draft), so training it costs the target nothing.
It starts as the target's LM head rows for the kept ids (the tied embedding rows when the target
ties them), so the untrained draft is exactly "the self-draft restricted to V' tokens".
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from specserve.models.llama import LlamaModel
from specserve.train.dense_forward import dense_layers


def check_draft_layers(num_layers: int, target_layers: int) -> None:
    if not 1 <= num_layers <= target_layers:
        raise ValueError(f"the draft needs 1..{target_layers} layers, got {num_layers}")


class DraftNet(nn.Module):
    def __init__(self, target: LlamaModel, num_layers: int, head_ids: torch.Tensor | None):
        super().__init__()
        check_draft_layers(num_layers, target.cfg.num_layers)
        self.cfg = dataclasses.replace(target.cfg, num_layers=num_layers)
        self.layers = copy.deepcopy(target.layers[:num_layers])
        self.norm = copy.deepcopy(target.norm)
        rows = target.lm_head.weight.detach()
        if head_ids is not None:
            rows = rows[head_ids]
        self.head = nn.Linear(self.cfg.hidden_size, rows.shape[0], bias=False)
        self.head.weight = nn.Parameter(rows.clone())
        self.head_ids = head_ids  # None: the full vocabulary, in order
        self.rotary = target.rotary
        self.requires_grad_(True)

    @property
    def head_size(self) -> int:
        return self.head.weight.shape[0]

    def hidden(self, embeds: torch.Tensor) -> torch.Tensor:
        """embeds: [B, T, hidden] from the target's embedding -> final normed hidden states."""
        return self.norm(dense_layers(self.layers, embeds, self.rotary))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> [..., V'] fp32 logits over the head's ids. Kept apart from `hidden`
        so training pays the head only at the reply positions."""
        return self.head(hidden).float()

    def to_full_ids(self, head_index: torch.Tensor) -> torch.Tensor:
        return head_index if self.head_ids is None else self.head_ids[head_index]


def select_head_ids(hidden_rows: list[torch.Tensor], lm_head: torch.Tensor, size: int,
                    chunk: int = 1024, always: Sequence[int] = ()) -> torch.Tensor | None:
    """The `size` token ids with the most target probability mass over the given final hidden
    states (FR-Spec's frequency-ranked head, with the target's probabilities instead of counts),
    and `always` (the end-of-sequence ids: replies cut at the length cap give them little mass,
    and a draft without them could never guess an end). Returns them sorted, or None when size
    is 0 or covers the whole vocabulary."""
    vocab = lm_head.shape[0]
    if size <= 0 or size >= vocab:
        return None
    mass = torch.zeros(vocab)
    with torch.no_grad():
        for rows in hidden_rows:
            for part in rows.split(chunk):
                mass += (part.to(lm_head.dtype) @ lm_head.T).float().softmax(dim=-1).sum(dim=0)
    mass[[t for t in always if 0 <= t < vocab]] = float("inf")
    return mass.topk(size).indices.sort().values
