"""An EAGLE-style draft head (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking
Feature Uncertainty").

The head guesses the target's next *feature* (its final normed hidden state) rather than the next
token from scratch: at position j it reads the target's feature at j - 1 and the embedding of
token j, fuses them (`fc`: 2H -> H), runs one decoder layer with its own paged KV cache, and
predicts the feature at j (through a final norm, as the target's features are normed); the
target's own LM head (restricted to `head_ids`, FR-Spec style)
turns it into the guess for token j + 1. Chained guesses feed the head's predicted feature back
in place of the target's. The target's embedding and LM head are shared, never copied.

Fused features (EAGLE-3, Li et al. 2025): the target's final layer is specialised to its own
next token, so the head also reads the residual stream after a low and a middle layer
(`feature_layers`), each RMS-normalised to the final feature's scale (`aux_feature`). A feature
row is then [final | layer a | layer b], and fc takes (2 + len(feature_layers)) H inputs.
Measured on the embedded model, same data, 3 minutes of training: 30.1% held-out first-guess
agreement against 25.3% with the final feature alone; 39.6% after 15 minutes, where the
session-3 head plateaued at ~37% (docs/results/2026-12-02-session11). A chained guess
has only the head's own predicted final feature: its layer slots read zeros, which training
shows the head on a share of its positions (EagleConfig.aux_dropout).

Position 0 has no previous feature: the head reads zeros there, in training and in serving
alike, and also wherever the target never computed a feature (a prefix-cache hit).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from specserve.config import ModelConfig
from specserve.layers.attention import AttentionMetadata
from specserve.layers.fused import rms_norm
from specserve.layers.kv_cache import LayerKVCache
from specserve.layers.rotary import RotaryEmbedding
from specserve.models.llama import DecoderLayer, RMSNorm
from specserve.train.dense_forward import dense_layers


def check_feature_layers(feature_layers: tuple[int, ...], target_layers: int) -> None:
    if any(not 0 <= i < target_layers - 1 for i in feature_layers):
        raise ValueError(f"feature_layers {feature_layers} must be target layers below the "
                         f"last (0..{target_layers - 2})")


class EagleHead(nn.Module):
    def __init__(self, target_cfg: ModelConfig, embed_tokens: nn.Embedding,
                 head_weight: torch.Tensor, head_ids: torch.Tensor | None, dtype: torch.dtype,
                 feature_layers: tuple[int, ...] = (), context: int | None = None):
        super().__init__()
        check_feature_layers(feature_layers, target_cfg.num_layers)
        # The target's kind of layer (Qwen3's q/k norms included): it starts as a copy of the
        # target's last one (train/eagle.py new_head).
        self.cfg = dataclasses.replace(target_cfg, num_layers=1)
        self.dtype = dtype  # fc may become a PackedLinear (no .weight) in bf16
        self.feature_layers = tuple(sorted(set(feature_layers)))  # the order rows hold them in
        # Positions before the one it guesses from that the head was trained to read (None: the
        # whole context); the proposer serves it the same window (eagle.EagleSeq).
        self.context = context
        h = target_cfg.hidden_size
        self.feature_size = h * (1 + len(self.feature_layers))  # one feature row's width
        self.fc = nn.Linear(h + self.feature_size, h, bias=False, dtype=dtype)
        self.layers = nn.ModuleList([DecoderLayer(self.cfg, 0).to(dtype)])
        # The target's features are *normed* hidden states; predicting them through a final
        # norm (trained from the target's) keeps the output on their scale from the first step.
        self.norm = RMSNorm(h, target_cfg.rms_norm_eps).to(dtype)
        # Shared with the target (a plain attribute list keeps them out of state_dict()).
        self._shared = [embed_tokens]
        self.head_ids = head_ids  # None: the full vocabulary, in order
        rows = head_weight if head_ids is None else head_weight[head_ids]
        self.lm_head = nn.Linear(h, rows.shape[0], bias=False, dtype=dtype)
        self.lm_head.weight = nn.Parameter(rows.detach().to(dtype), requires_grad=False)
        self.rotary = RotaryEmbedding(self.cfg.head_dim, self.cfg.max_position,
                                      self.cfg.rope_theta, dtype, head_weight.device,
                                      self.cfg.rope_scaling)

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self._shared[0]

    @property
    def head_size(self) -> int:
        return self.lm_head.out_features

    def fuse(self, input_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        emb = self.embed_tokens(input_ids).to(self.dtype)
        return self.fc(torch.cat([emb, features.to(emb.dtype)], dim=-1))

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[LayerKVCache], meta: AttentionMetadata,
                features: torch.Tensor | None = None) -> torch.Tensor:
        """The engine's model interface ([num_tokens] ids and positions, a paged cache) plus the
        previous feature rows [num_tokens, feature_size] (None: zeros, as the start-up profile
        runs it). Returns the predicted final features [num_tokens, hidden]."""
        if features is None:
            features = torch.zeros(len(input_ids), self.feature_size, dtype=self.dtype,
                                   device=input_ids.device)
        x = self.fuse(input_ids, features)
        cos, sin = self.rotary.lookup(positions)
        x, residual = self.layers[0](x, None, cos, sin, kv_caches[0], meta)
        return self.norm(x, residual)[0]

    def dense(self, input_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Training: [B, T] ids and [B, T, feature_size] previous features -> [B, T, hidden]."""
        return self.norm(dense_layers(self.layers, self.fuse(input_ids, features), self.rotary))

    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """[n, hidden] -> [n, head_size] logits over the head's ids, fp32 unless float32 is
        False (LlamaModel.compute_logits: the runner calls both alike)."""
        logits = self.lm_head(hidden)
        return logits.float() if float32 else logits

    def to_full_ids(self, head_index: torch.Tensor) -> torch.Tensor:
        return head_index if self.head_ids is None else self.head_ids[head_index]


def aux_feature(stream: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """A target layer's residual stream [..., hidden] -> the head's input: RMS-normalised (no
    weight), so it sits on the final (normed) feature's scale. Computed in fp32, as the
    decoder's RMSNorm with a unit weight: on the CPU kernel outside autograd (as torch ops, the
    serving hand-over spent 0.27 ms of a 25 ms step at concurrency 32 here), whose reassociated
    sum of squares may move a feature's last bf16 bit; serving and training featurize alike."""
    h = stream.shape[-1]
    return rms_norm(stream.reshape(-1, h), stream.new_ones(h), eps).view(stream.shape)


def feature_rows(final: torch.Tensor, streams: list[torch.Tensor]) -> torch.Tensor:
    """The target's final normed hidden states [..., H] and the residual streams after the
    head's feature layers -> feature rows [..., (1 + len(streams)) H]."""
    if not streams:
        return final
    return torch.cat([final, *(aux_feature(s).to(final.dtype) for s in streams)], dim=-1)


def shift_features(hidden: torch.Tensor) -> torch.Tensor:
    """[B, T, F] target feature rows -> the head's inputs: position j reads row j - 1 (zeros at
    0)."""
    return torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], dim=1)
