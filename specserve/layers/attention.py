"""Paged attention for a flat batch of variable-length sequences.

Each layer's KV pool (kv_cache.py) is a flat array of slots; a sequence's keys live in the slots
its block table names.

- Where the fused C++ kernel is built (paged_attention_ext.py, CPUs), every query of a step goes
  to it in one group: decodes, speculative verification and prefill chunks alike
  (model_runner.KERNEL_QUERY_LEN). It reads K/V in place through the block tables (8-bit pools
  are dequantized inside it) and never materialises the scores.
- Otherwise (a GPU, or no extension) the PyTorch path gathers each sequence's K/V through its
  block table with one `index_select`, then runs two batched matmuls per group, padded to the
  group's longest query and context; decodes and verification (up to SHORT_QUERY_LEN tokens)
  form one group and prefill chunks another, so that short queries are not padded to a chunk's
  length. (CPU SDPA is ~10x slower than this for short queries, measured; docs/performance.md.)

No per-sequence Python loop runs inside a layer, and caches are never concatenated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from specserve.hardware import cpu_has_bf16_gemm
from specserve.layers import paged_attention_ext
from specserve.layers.kv_cache import LayerKVCache

if TYPE_CHECKING:
    from specserve.lora.batch import LoRABatch


@dataclass(slots=True)
class AttnGroup:
    num_seqs: int
    max_query_len: int
    max_context_len: int
    num_tokens: int  # real (unpadded) query tokens of this group, contiguous in the flat batch
    # Fused-kernel path: the group's block tables and each query token's sequence and position.
    block_tables: torch.Tensor | None = None  # [num_seqs, max_blocks] int32
    token_seq: torch.Tensor | None = None  # [num_tokens] int32
    token_pos: torch.Tensor | None = None  # [num_tokens] int32
    # Gather path:
    # [num_seqs * max_query_len] flat token index for each padded query slot (None: no padding)
    query_gather: torch.Tensor | None = None
    query_scatter: torch.Tensor | None = None  # [num_tokens] padded position of each real token
    kv_gather: torch.Tensor | None = None  # [num_seqs * max_context_len] slot of each position
    attn_bias: torch.Tensor | None = None  # [num_seqs, max_query_len, max_context_len] 0 / -inf


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] cache slot where each new token's K/V is written
    groups: list[AttnGroup]
    block_size: int
    # Which rows run which LoRA adapter (specserve/lora/batch.py); None: the base model only.
    lora: LoRABatch | None = None


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    cache: LayerKVCache,  # already holding this step's K/V (fused.rope_write_kv)
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_heads * head_dim]
    outs = []
    start = 0
    for g in meta.groups:
        qg = q[start:start + g.num_tokens] if len(meta.groups) > 1 else q
        start += g.num_tokens
        if g.block_tables is not None:
            outs.append(paged_attention_ext.paged_attention_short(
                qg, cache.k, cache.v, g.block_tables, g.token_seq, g.token_pos,
                meta.block_size, scale, k_scale=cache.k_scale, v_scale=cache.v_scale,
                kv_format=cache.kernel_format))
            continue
        if g.query_gather is not None:
            qg = qg.index_select(0, g.query_gather)
        out = _gather_attention(qg, cache, g, scale)
        if g.query_scatter is not None:
            out = out.index_select(0, g.query_scatter)
        outs.append(out)
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _gather_attention(q: torch.Tensor, cache: LayerKVCache, g: AttnGroup,
                      scale: float) -> torch.Tensor:
    """q: [num_seqs * max_query_len, num_heads, head_dim] -> [same, num_heads * head_dim]."""
    b, nq, c = g.num_seqs, g.max_query_len, g.max_context_len
    num_heads, head_dim = q.shape[1], q.shape[2]
    k, v = cache.gather(g.kv_gather)  # [b * c, kvh, head_dim] each
    out_dtype = q.dtype
    if out_dtype == torch.bfloat16 and q.is_cpu and not cpu_has_bf16_gemm():
        # A bf16 bmm without bf16 GEMMs is torch's slow generic path (specserve/hardware.py).
        q, k, v = q.float(), k.float(), v.float()
    kvh = k.shape[1]
    grp = num_heads // kvh  # query heads per KV head (GQA); head h reads KV head h // grp
    # [b * kvh, c, head_dim]
    k = k.view(b, c, kvh, head_dim).transpose(1, 2).reshape(b * kvh, c, head_dim)
    v = v.view(b, c, kvh, head_dim).transpose(1, 2).reshape(b * kvh, c, head_dim)
    # [b * kvh, grp * nq, head_dim]
    qh = q.view(b, nq, kvh, grp, head_dim).permute(0, 2, 3, 1, 4).reshape(b * kvh, grp * nq,
                                                                             head_dim)
    scores = torch.bmm(qh, k.transpose(1, 2)).mul_(scale).view(b, kvh, grp, nq, c)
    scores.add_(g.attn_bias.view(b, 1, 1, nq, c))  # 0 where allowed, -inf where masked
    probs = scores.softmax(dim=-1).view(b * kvh, grp * nq, c)
    out = torch.bmm(probs, v).view(b, kvh, grp, nq, head_dim)
    return out.permute(0, 3, 1, 2, 4).reshape(b * nq, num_heads * head_dim).to(out_dtype)
