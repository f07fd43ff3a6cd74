"""Turns a scheduler step into tensors, runs the model, and returns logits where needed."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from specserve.config import CacheConfig, ModelConfig
from specserve.engine.request import Request
from specserve.layers import paged_attention_ext
from specserve.layers.attention import AttentionMetadata, AttnGroup
from specserve.layers.kv_cache import LayerKVCache
from specserve.layers.kv_cache import kv_bytes_per_token as layer_kv_bytes
from specserve.lora.batch import LoRABatch
from specserve.models.layer_loop import LayerLoop
from specserve.models.llama import LlamaModel

# Queries up to this long share one attention group; longer ones (prefill chunks) form another.
# The gather path pads a group to its longest query, so there decodes and speculative
# verification (a few tokens) stay apart from prefill chunks.
SHORT_QUERY_LEN = 16
# The fused kernel pads nothing (it cuts a sequence's queries into runs with their causal
# positions) and materialises no scores, so every query joins its one group, which is also what
# the C++ layer loop takes. Session 27 sent chunks of up to 256 tokens there (a 41-token prompt:
# 30 ms through the gather path, 16.5 through the kernel); since session 29's AMX prefill tiles
# a 2,048-token prompt reaches its first token in 0.79 s through the kernel against 1.8 s
# through the gather path (bf16; fp32 2.5 s against 4.1; docs/performance.md).
KERNEL_QUERY_LEN = sys.maxsize


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
    return layer_kv_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype)


@dataclass(slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    meta: AttentionMetadata
    order: list[int]  # scheduled index of each request in flat-batch order
    query_start: list[int]  # flat offset of each request's tokens (scheduled order)


class ModelRunner:
    def __init__(self, model: LlamaModel, cfg: ModelConfig, cache_cfg: CacheConfig,
                 num_blocks: int, kv_dtype: torch.dtype):
        self.model = model
        self.cfg = cfg
        self.block_size = cache_cfg.block_size
        self.dtype = model.embed_tokens.weight.dtype
        # The pools live with the weights; step metadata is built on the host and moved once.
        self.device = model.embed_tokens.weight.device
        self.num_blocks = num_blocks
        num_slots = num_blocks * self.block_size
        # One pool per layer, indexed by slot = block_id * block_size + offset.
        self.kv_caches = [LayerKVCache(num_slots, cfg.num_kv_heads, cfg.head_dim, kv_dtype,
                                       self.dtype, self.device) for _ in range(cfg.num_layers)]
        # Short queries read the pool in place with the fused (CPU) kernel when it can: pools in
        # the model's dtype, or 8-bit pools (dequantized inside the kernel).
        self.use_kernel = (self.dtype in (torch.bfloat16, torch.float32)
                           and kv_dtype in (self.dtype, torch.int8, torch.float8_e4m3fn)
                           and self.device.type == "cpu" and paged_attention_ext.available())
        # Decode-shaped steps run the decoder layers in one C++ call when the model allows it.
        self.layer_loop = (LayerLoop.build(model, self.kv_caches, self.block_size)
                           if self.use_kernel else None)
        # Layers whose output residual stream an EAGLE head reads beside the final hidden
        # states (its fused features); set by the engine for such a proposer.
        self.aux_layers: tuple[int, ...] = ()
        # Whether requests may carry a LoRA adapter (Request.lora; the target's runner of an
        # engine with enable_lora): each step then maps its rows to their adapters.
        self.lora_enabled = False

    @property
    def kv_cache_bytes(self) -> int:
        return sum(c.nbytes for c in self.kv_caches)

    def _kernel_group(self, reqs: list[tuple[Request, int]]) -> AttnGroup:
        """Metadata for the fused kernel: block tables plus each token's sequence/position."""
        q_lens = [n for _, n in reqs]
        max_blocks = max(len(r.block_ids) for r, _ in reqs)
        table = np.zeros((len(reqs), max_blocks), dtype=np.int32)
        for i, (r, _) in enumerate(reqs):
            table[i, : len(r.block_ids)] = r.block_ids
        token_seq = np.repeat(np.arange(len(reqs), dtype=np.int32), q_lens)
        token_pos = np.concatenate([np.arange(r.num_computed_tokens, r.num_computed_tokens + n,
                                              dtype=np.int32) for r, n in reqs])
        return AttnGroup(num_seqs=len(reqs), max_query_len=max(q_lens),
                         max_context_len=int(token_pos.max()) + 1, num_tokens=len(token_pos),
                         block_tables=torch.from_numpy(table),
                         token_seq=torch.from_numpy(token_seq),
                         token_pos=torch.from_numpy(token_pos))

    def _group(self, reqs: list[tuple[Request, int]]) -> AttnGroup:
        bs = self.block_size
        num_seqs = len(reqs)
        q_lens = np.array([n for _, n in reqs])
        starts = np.array([r.num_computed_tokens for r, _ in reqs])
        ctx_lens = starts + q_lens
        max_q, max_ctx = int(q_lens.max()), int(ctx_lens.max())
        max_blocks = -(-max_ctx // bs)
        table = np.zeros((num_seqs, max_blocks), dtype=np.int64)
        for i, (r, _) in enumerate(reqs):
            ids = r.block_ids[:max_blocks]
            table[i, : len(ids)] = ids
        # [num_seqs, max_ctx]: slot of every context position through the block table
        slots = (table[:, :, None] * bs + np.arange(bs)).reshape(num_seqs, -1)[:, :max_ctx]
        q_pos = np.arange(max_q)[None, :]  # [1, max_q]
        valid_q = q_pos < q_lens[:, None]  # [num_seqs, max_q]
        # Absolute position of each padded query; padding attends to position 0 only.
        query_positions = np.where(valid_q, starts[:, None] + q_pos, 0)
        key_pos = np.arange(max_ctx)
        mask = key_pos[None, None, :] <= query_positions[:, :, None]  # causal
        query_gather = query_scatter = None
        if not valid_q.all():
            flat_offsets = np.concatenate([[0], np.cumsum(q_lens)[:-1]])
            gather = np.where(valid_q, flat_offsets[:, None] + q_pos, 0)
            query_gather = torch.from_numpy(gather.reshape(-1))
            query_scatter = torch.from_numpy(np.flatnonzero(valid_q.reshape(-1)))
        return AttnGroup(
            num_seqs=num_seqs, max_query_len=max_q, max_context_len=max_ctx,
            num_tokens=int(q_lens.sum()), query_gather=query_gather, query_scatter=query_scatter,
            kv_gather=torch.from_numpy(slots.reshape(-1)),
            attn_bias=torch.from_numpy(np.where(mask, 0.0, -np.inf)).to(self.dtype),
        )

    def prepare(self, scheduled: list[tuple[Request, int]]) -> StepInputs:
        bs = self.block_size
        limit = KERNEL_QUERY_LEN if self.use_kernel else SHORT_QUERY_LEN
        short = [i for i, (_, n) in enumerate(scheduled) if n <= limit]
        long = [i for i, (_, n) in enumerate(scheduled) if n > limit]
        order = short + long
        ids: list[int] = []
        positions: list[np.ndarray] = []
        slot_mapping: list[np.ndarray] = []
        query_start = [0] * len(scheduled)
        for i in order:
            req, n = scheduled[i]
            query_start[i] = len(ids)
            start = req.num_computed_tokens
            known = len(req.all_token_ids)
            tokens = req.all_token_ids[start:start + n]
            if start + n > known:  # the rest are speculative (draft) tokens
                tokens = tokens + req.spec_token_ids[max(start - known, 0):start + n - known]
            ids.extend(tokens)
            pos = np.arange(start, start + n)
            positions.append(pos)
            table = np.asarray(req.block_ids)
            slot_mapping.append(table[pos // bs] * bs + pos % bs)
        groups = []
        if short:
            reqs = [scheduled[i] for i in short]
            groups.append(self._kernel_group(reqs) if self.use_kernel else self._group(reqs))
        if long:
            groups.append(self._group([scheduled[i] for i in long]))
        meta = AttentionMetadata(slot_mapping=torch.from_numpy(np.concatenate(slot_mapping)),
                                 groups=groups, block_size=bs)
        if self.lora_enabled:
            meta.lora = LoRABatch.build(
                [(getattr(r, "lora", None), query_start[i], query_start[i] + n)
                 for i, (r, n) in enumerate(scheduled)], self.device)
        inputs = StepInputs(torch.tensor(ids, dtype=torch.long),
                            torch.from_numpy(np.concatenate(positions)), meta, order, query_start)
        return inputs if self.device.type == "cpu" else self._to_device(inputs)

    def _to_device(self, inputs: StepInputs) -> StepInputs:
        """Copy a step's tensors to the model's device (one host-to-device copy each)."""
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(self.device, non_blocking=True)

        meta = inputs.meta
        meta.slot_mapping = move(meta.slot_mapping)
        for g in meta.groups:
            g.query_gather, g.query_scatter = move(g.query_gather), move(g.query_scatter)
            g.kv_gather, g.attn_bias = move(g.kv_gather), move(g.attn_bias)
        inputs.input_ids, inputs.positions = move(inputs.input_ids), move(inputs.positions)
        return inputs

    def execute(self, inputs: StepInputs, logits_indices: torch.Tensor,
                *model_inputs: torch.Tensor, on_forward: Callable[[], None] | None = None,
                float32_logits: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the forward; return hidden states [num_tokens, hidden] (on the model's device) and
        logits of the rows in logits_indices [n, vocab] fp32 on the host, where sampling runs
        (per-request seeded generators are host generators). With aux_layers set, the hidden
        states come with the residual streams after those layers appended along the last dim
        ([num_tokens, hidden * (1 + len(aux_layers))]). model_inputs: what the model takes
        after the metadata (an EAGLE head's features). on_forward: see LLMEngine.step; called
        as late as possible, just before the layers run (with the GIL released, on the layer
        loop). float32_logits=False: the logits in the LM head's dtype (see
        LlamaModel.compute_logits)."""
        aux = {"aux_layers": self.aux_layers} if self.aux_layers else {}
        if self.layer_loop is not None and not model_inputs and inputs.meta.lora is None \
                and self.layer_loop.accepts(inputs.meta):
            out = self.layer_loop.forward(inputs.input_ids, inputs.positions, inputs.meta,
                                          before_layers=on_forward, **aux)
        else:
            if on_forward is not None:
                on_forward()
            out = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta,
                             *model_inputs, **aux)
        hidden, streams = out if aux else (out, [])
        rows = hidden.index_select(0, logits_indices.to(self.device))
        logits = self.model.compute_logits(rows, float32=float32_logits).cpu()
        return (torch.cat([hidden, *streams], dim=-1) if streams else hidden), logits
