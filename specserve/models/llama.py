"""Llama / Qwen2 / Qwen3-style decoder for flat, variable-length batches over a paged KV cache.

One forward takes the scheduled tokens of many sequences concatenated (prefill chunks, decodes and
speculative verification tokens mixed), their positions and the attention metadata; logits are
computed only for the rows the caller asks for.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from specserve.config import ModelConfig
from specserve.layers import fused
from specserve.layers.attention import AttentionMetadata, paged_attention
from specserve.layers.kv_cache import LayerKVCache
from specserve.layers.rotary import RotaryEmbedding
from specserve.lora.batch import LoRABatch


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """RMSNorm(x) * w; given a residual stream (vLLM's convention), first adds x into it and
        returns (normed, new residual). The fused path updates x and residual in place."""
        if residual is None:
            return fused.rms_norm(x, self.weight, self.eps)
        return fused.add_rms_norm(x, residual, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg = cfg
        self.layer = layer  # which adapter updates apply (meta.lora)
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size,
                                  bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        self.scale = cfg.head_dim ** -0.5
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def norm_qk(self, qkv: torch.Tensor) -> torch.Tensor:
        """Qwen3's per-head RMSNorm of q and k, on the projection's output (adapter updates
        included) and before rope; qkv unchanged for models without it."""
        if self.q_norm is None:
            return qkv
        c = self.cfg
        q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        # Heads as rows of a 2-D tensor: the fused kernel's shape.
        q = self.q_norm(q.reshape(-1, c.head_dim)).view(q.shape)
        k = self.k_norm(k.reshape(-1, c.head_dim)).view(k.shape)
        return torch.cat([q, k, v], dim=-1)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                kv_cache: LayerKVCache, meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(x)  # [num_tokens, q_size + 2 * kv_size]
        if meta.lora is not None:
            meta.lora.add(qkv, x, self.layer, "qkv_proj")
        qkv = self.norm_qk(qkv)
        # The new tokens' K/V go into the pool first, so a query sees itself and its own chunk.
        q = fused.rope_write_kv(qkv, cos, sin, meta.slot_mapping, kv_cache, self.cfg.num_heads)
        out = paged_attention(q, kv_cache, meta, self.scale)
        if meta.lora is None:
            return self.o_proj(out)
        return meta.lora.add(self.o_proj(out), out, self.layer, "o_proj")


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.layer = layer

    def forward(self, x: torch.Tensor, lora: LoRABatch | None = None) -> torch.Tensor:
        if lora is None:
            return self.down_proj(fused.silu_and_mul(self.gate_up_proj(x)))
        h = fused.silu_and_mul(lora.add(self.gate_up_proj(x), x, self.layer, "gate_up_proj"))
        return lora.add(self.down_proj(h), h, self.layer, "down_proj")


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, layer)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, layer)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                sin: torch.Tensor, kv_cache: LayerKVCache,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-norm residual block; the residual add is fused into the next norm, so this
        returns the MLP's output and the residual stream without it (None: x is the stream)."""
        if residual is None:  # first layer: x is the residual stream
            x, residual = self.input_norm(x), x
        else:
            x, residual = self.input_norm(x, residual)
        x = self.attn(x, cos, sin, kv_cache, meta)
        x, residual = self.post_attn_norm(x, residual)
        return self.mlp(x, meta.lora), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = rotary  # a plain table on the weights' device (to_empty leaves it alone)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[LayerKVCache], meta: AttentionMetadata,
                aux_layers: tuple[int, ...] = ()) -> torch.Tensor | tuple[torch.Tensor, list]:
        """input_ids, positions: [num_tokens] -> final hidden states [num_tokens, hidden].
        With aux_layers (an EAGLE head's fused features), also the residual stream after each
        of those layers: (hidden, [stream, ...])."""
        x, residual = self.embed_tokens(input_ids), None
        cos, sin = self.rotary.lookup(positions)
        aux = []
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            x, residual = layer(x, residual, cos, sin, kv_cache, meta)
            if i in aux_layers:
                aux.append(x + residual)
        hidden = self.norm(x, residual)[0] if residual is not None else self.norm(x)
        return (hidden, aux) if aux_layers else hidden

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """[n, hidden] -> [n, vocab] in fp32 (sampling needs the precision), or without float32
        in the LM head's own dtype (a greedy step reads only the argmax, which the fp32 copy
        does not change)."""
        logits = self.lm_head(hidden)
        return logits.float() if float32 else logits


@contextlib.contextmanager
def _no_random_init():
    """Skip the random initialisation of Linear and Embedding weights, which the checkpoint
    overwrites anyway. On the meta device torch runs it (like any op that computes, such as the
    rotary table's, built before the model for that reason) through its Python reference ops,
    whose first call imports torch._dynamo and with it triton: ~2 s of every engine's start-up,
    and triton's bindings then print "leaked" lines at interpreter exit."""
    saved = nn.Linear.reset_parameters, nn.Embedding.reset_parameters
    nn.Linear.reset_parameters = nn.Embedding.reset_parameters = lambda self: None
    try:
        yield
    finally:
        nn.Linear.reset_parameters, nn.Embedding.reset_parameters = saved


def build_model(cfg: ModelConfig, state_dict: dict[str, torch.Tensor],
                dtype: torch.dtype, device: torch.device | str = "cpu") -> LlamaModel:
    rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position, cfg.rope_theta, dtype, device,
                             cfg.rope_scaling)
    with torch.device("meta"), _no_random_init():
        model = LlamaModel(cfg, rotary)
    # Allocated in the serving dtype (free on meta), and each checkpoint tensor is converted once
    # as load_state_dict copies it in: an fp32 model first would need twice a bf16 model's
    # device memory (32 GB for an 8B model) and a converted copy of every weight on the host.
    model = model.to(dtype).to_empty(device=device)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing}, "
                         f"unexpected {unexpected}")
    return model.eval()
