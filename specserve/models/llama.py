"""Llama / Qwen2-style decoder for flat, variable-length batches over a paged KV cache.

One forward takes the scheduled tokens of many sequences concatenated (prefill chunks, decodes and
speculative verification tokens mixed), their positions and the attention metadata; logits are
computed only for the rows the caller asks for.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specserve.config import ModelConfig
from specserve.layers.attention import AttentionMetadata, paged_attention
from specserve.layers.kv_cache import LayerKVCache
from specserve.layers.rotary import RotaryEmbedding, apply_rotary


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size,
                                  bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        self.scale = cfg.head_dim ** -0.5

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                kv_cache: LayerKVCache, meta: AttentionMetadata) -> torch.Tensor:
        c = self.cfg
        n = x.shape[0]
        qkv = self.qkv_proj(x)  # [num_tokens, q_size + 2 * kv_size]
        # Rotate q and k in one go: [num_tokens, num_heads + num_kv_heads, head_dim]
        qk = apply_rotary(qkv[:, : c.q_size + c.kv_size].view(n, -1, c.head_dim), cos, sin)
        q, k = qk.split([c.num_heads, c.num_kv_heads], dim=1)
        v = qkv[:, c.q_size + c.kv_size:].view(n, c.num_kv_heads, c.head_dim)
        out = paged_attention(q, k, v, kv_cache, meta, self.scale)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)  # SwiGLU (Shazeer 2020)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, kv_cache, meta):
        x = x + self.attn(self.input_norm(x), cos, sin, kv_cache, meta)
        return x + self.mlp(self.post_attn_norm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position, cfg.rope_theta, dtype)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[LayerKVCache],
                meta: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions: [num_tokens] -> final hidden states [num_tokens, hidden]."""
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary.lookup(positions)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, cos, sin, kv_cache, meta)
        return self.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden] -> [n, vocab] in fp32 (sampling needs the precision)."""
        return self.lm_head(hidden).float()


def build_model(cfg: ModelConfig, state_dict: dict[str, torch.Tensor],
                dtype: torch.dtype, device: torch.device | str = "cpu") -> LlamaModel:
    with torch.device("meta"):
        model = LlamaModel(cfg, dtype)
    model = model.to_empty(device=device)
    model.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position, cfg.rope_theta, dtype, device)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    missing, unexpected = model.load_state_dict(
        {k: v.to(dtype) for k, v in state_dict.items()}, strict=False)
    missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing}, "
                         f"unexpected {unexpected}")
    return model.to(dtype).eval()
