"""Paged attention for a flat batch of variable-length sequences.

The KV cache of one layer is a flat pool of slots `[num_blocks * block_size, num_kv_heads,
head_dim]`. A sequence's keys live in the slots its block table names. Each step, the model runner
turns the block tables into gather indices once; every layer then reads K/V through those indices
in one `index_select` per group and runs one batched SDPA per group: no per-sequence Python loop
inside a layer, and no concatenation of per-sequence caches.

Sequences are split into at most two groups so that padding stays cheap: short queries (decodes
and speculative verification, a few tokens each) and long ones (prefill chunks). Each group is
padded to its longest query and longest context. (A fused kernel that reads the blocks in
place would save the gather's extra pass over K/V; see docs/performance.md.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttnGroup:
    num_seqs: int
    max_query_len: int
    max_context_len: int
    num_tokens: int  # real (unpadded) query tokens of this group, contiguous in the flat batch
    # [num_seqs * max_query_len] flat token index for each padded query slot (None: no padding)
    query_gather: torch.Tensor | None
    # [num_tokens] padded position of each real token (None: no padding)
    query_scatter: torch.Tensor | None
    kv_gather: torch.Tensor  # [num_seqs * max_context_len] cache slot of each context position
    attn_bias: torch.Tensor  # [num_seqs, max_query_len, max_context_len]: 0 attend, -inf not


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] cache slot where each new token's K/V is written
    groups: list[AttnGroup]


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_heads * head_dim]
    # The new tokens' K/V go into the pool first, so a query sees itself and its own chunk.
    k_cache.index_copy_(0, meta.slot_mapping, k.to(k_cache.dtype))
    v_cache.index_copy_(0, meta.slot_mapping, v.to(v_cache.dtype))
    outs = []
    start = 0
    for g in meta.groups:
        qg = q[start:start + g.num_tokens]
        start += g.num_tokens
        if g.query_gather is not None:
            qg = qg.index_select(0, g.query_gather)
        out = _gather_attention(qg, k_cache, v_cache, g, scale)
        if g.query_scatter is not None:
            out = out.index_select(0, g.query_scatter)
        outs.append(out)
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _gather_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      g: AttnGroup, scale: float) -> torch.Tensor:
    """Gather each sequence's K/V through its block table, then two batched matmuls per group.
    q: [num_seqs * max_query_len, num_heads, head_dim] -> [same, num_heads * head_dim].
    (The CPU SDPA kernel is ~10x slower than this for short queries, measured.)"""
    b, nq, c = g.num_seqs, g.max_query_len, g.max_context_len
    num_heads, head_dim = q.shape[1], q.shape[2]
    kvh = k_cache.shape[1]
    grp = num_heads // kvh  # query heads per KV head (GQA); head h reads KV head h // grp
    # [b * kvh, c, head_dim]
    k = k_cache.index_select(0, g.kv_gather).view(b, c, kvh, head_dim).transpose(1, 2)
    k = k.reshape(b * kvh, c, head_dim).to(q.dtype)
    v = v_cache.index_select(0, g.kv_gather).view(b, c, kvh, head_dim).transpose(1, 2)
    v = v.reshape(b * kvh, c, head_dim).to(q.dtype)
    # [b * kvh, grp * nq, head_dim]
    qh = q.view(b, nq, kvh, grp, head_dim).permute(0, 2, 3, 1, 4).reshape(b * kvh, grp * nq,
                                                                             head_dim)
    scores = torch.bmm(qh, k.transpose(1, 2)).mul_(scale).view(b, kvh, grp, nq, c)
    scores.add_(g.attn_bias.view(b, 1, 1, nq, c))  # 0 where allowed, -inf where masked
    probs = scores.softmax(dim=-1).view(b * kvh, grp * nq, c)
    out = torch.bmm(probs, v).view(b, kvh, grp, nq, head_dim)
    return out.permute(0, 3, 1, 2, 4).reshape(b * nq, num_heads * head_dim)
