"""A plain, non-paged forward over a LlamaModel's own modules, for training.

The engine's forward reads and writes a paged KV cache and runs under inference mode; training
needs neither. This forward uses the very same weights and building blocks (RMSNorm, the rotary
tables of `specserve.layers.rotary`, the fused qkv / gate_up projections) on padded [batch, time]
tensors with causal SDPA, so gradients flow and the logits match the engine's.

Sequences are right-padded: with a causal mask a real token never attends to padding after it,
so no attention mask beyond `is_causal` is needed; the padded rows are simply ignored.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specserve.config import ModelConfig
from specserve.layers.rotary import RotaryEmbedding, apply_rotary
from specserve.models.llama import Attention, DecoderLayer, LlamaModel


def dense_attention(attn: Attention, x: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, hidden] (already normed) -> [B, T, hidden]."""
    c: ModelConfig = attn.cfg
    b, t, _ = x.shape
    qkv = attn.norm_qk(attn.qkv_proj(x))
    qk = apply_rotary(qkv[..., : c.q_size + c.kv_size].view(b, t, -1, c.head_dim), cos, sin)
    q, k = qk.split([c.num_heads, c.num_kv_heads], dim=2)
    v = qkv[..., c.q_size + c.kv_size:].view(b, t, c.num_kv_heads, c.head_dim)
    # GQA: each kv head serves num_heads // num_kv_heads query heads (the engine's grouping).
    group = c.num_heads // c.num_kv_heads
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=True, scale=attn.scale)
    return attn.o_proj(out.transpose(1, 2).reshape(b, t, c.q_size))


def dense_layer(layer: DecoderLayer, x: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
    x = x + dense_attention(layer.attn, layer.input_norm(x), cos, sin)
    return x + layer.mlp(layer.post_attn_norm(x))


def dense_layers(layers: nn.ModuleList, x: torch.Tensor, rotary: RotaryEmbedding) -> torch.Tensor:
    """Run decoder layers over embeddings x: [B, T, hidden]; positions are 0..T-1."""
    cos, sin = rotary.lookup(torch.arange(x.shape[1]))  # [T, head_dim]
    cos, sin = cos.to(x.dtype).unsqueeze(1), sin.to(x.dtype).unsqueeze(1)  # broadcast over heads
    for layer in layers:
        x = dense_layer(layer, x, cos, sin)
    return x


def dense_hidden(model: LlamaModel, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] token ids -> the final normed hidden states [B, T, hidden] of the full model."""
    return model.norm(dense_layers(model.layers, model.embed_tokens(input_ids), model.rotary))


def dense_hidden_and_streams(model: LlamaModel, input_ids: torch.Tensor,
                             aux_layers: tuple[int, ...]) -> tuple[torch.Tensor, list]:
    """dense_hidden, plus the residual stream [B, T, hidden] after each of aux_layers (in layer
    order), as LlamaModel.forward returns them for an EAGLE head's fused features."""
    x = model.embed_tokens(input_ids)
    streams = []
    start = 0
    for end in sorted(aux_layers):
        x = dense_layers(model.layers[start:end + 1], x, model.rotary)
        streams.append(x)
        start = end + 1
    return model.norm(dense_layers(model.layers[start:], x, model.rotary)), streams


def dense_logits(model: LlamaModel, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] -> [B, T, vocab] fp32 logits, as the engine's compute_logits gives them."""
    return model.lm_head(dense_hidden(model, input_ids)).float()


def pad_batch(seqs: list[list[int]], pad_id: int = 0) -> torch.Tensor:
    """Right-pad token lists into one [B, max_len] tensor."""
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out
