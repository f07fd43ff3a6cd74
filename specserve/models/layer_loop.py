"""LlamaModel's decoder layers as one C++ call, for decode-shaped steps on the CPU.

`LlamaModel.forward` stays the reference; this runs the very same ops in the same order
(layers/csrc/layer_loop.cpp) without the Python between them, which at batch 1 cost ~0.7 ms of a
~5.5 ms int4 step. It applies when every query of the step is short (one attention group read
by the fused kernel: decodes and speculative verification) and every linear is a kind the loop
knows (oneDNN-packed bf16 / fp32, int4pack or int8pack without bias, plain); otherwise `build`
returns None and the runner calls the model as usual.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import nn

from specserve.layers import paged_attention_ext
from specserve.layers.attention import AttentionMetadata
from specserve.layers.kv_cache import LayerKVCache
from specserve.layers.linear import PackedLinear
from specserve.models.llama import LlamaModel
from specserve.quant import int4
from specserve.quant.int4 import Int4Linear
from specserve.quant.int8 import SCALE_DTYPE, Int8Linear

_EMPTY = torch.empty(0)
PACKED, INT4, INT8, DENSE, PACKED_UPCAST = range(5)  # csrc/layer_loop.cpp's LinearKind


def _encode(lin: nn.Module, dtype: torch.dtype) -> tuple[list[torch.Tensor], list[int]] | None:
    """(w, aux, bias) and (kind, group) of a linear, or None when the loop cannot run it exactly
    as its module does."""
    if type(lin) is PackedLinear and lin.dtype == dtype:
        kind = PACKED_UPCAST if lin.upcast else PACKED
        aux = lin.weight_bf16 if lin.upcast else lin.weight_amx  # the few-rows kernel's copy
        return [lin.packed, aux, _EMPTY if lin.bias is None else lin.bias], [kind, 0]
    if type(lin) is nn.Linear:
        return [lin.weight, _EMPTY, _EMPTY if lin.bias is None else lin.bias], [DENSE, 0]
    if isinstance(lin, Int4Linear) and lin._direct and lin.compute_dtype == dtype:
        if lin.twin is not None and lin.twin.upcast:
            return None  # the loop runs a twin on bf16 activations as they are
        # The bias slot carries the bf16 twin (int4 linears with a bias stay in Python).
        twin = _EMPTY if lin.twin is None else lin.twin.packed
        return [lin.weight, lin.scales_and_zeros, twin], [INT4, lin.group_size]
    if type(lin) is Int8Linear and lin.bias is None and dtype == SCALE_DTYPE:
        return [lin.weight, lin.scales, _EMPTY], [INT8, 0]
    return None


class LayerLoop:
    def __init__(self, model: LlamaModel, plan_id: int):
        self.model = model
        self.plan_id = plan_id
        ext = paged_attention_ext.module()
        self._run = ext.run_layer_plan
        # The plan holds references to the weights and pools: free it with the loop.
        weakref.finalize(self, ext.free_layer_plan, plan_id)

    @classmethod
    def build(cls, model: nn.Module, kv_caches: list[LayerKVCache],
              block_size: int) -> LayerLoop | None:
        ext = paged_attention_ext.module()
        if ext is None or type(model) is not LlamaModel:
            return None
        dtype = model.embed_tokens.weight.dtype
        if model.embed_tokens.weight.device.type != "cpu" or dtype not in (torch.bfloat16,
                                                                          torch.float32):
            return None
        cache_format = {c.kernel_format for c in kv_caches}
        if len(cache_format) != 1 or any(not c.quantized and c.k.dtype != dtype
                                         for c in kv_caches):
            return None
        tensors: list[torch.Tensor] = []
        ints: list[int] = []
        for layer, cache in zip(model.layers, kv_caches, strict=True):
            linears = [_encode(m, dtype) for m in (layer.attn.qkv_proj, layer.attn.o_proj,
                                                   layer.mlp.gate_up_proj, layer.mlp.down_proj)]
            if any(e is None for e in linears) or layer.input_norm.weight.dtype != dtype:
                return None
            tensors += [layer.input_norm.weight.detach(), layer.post_attn_norm.weight.detach()]
            for ts, ks in linears:
                tensors += [t.detach() for t in ts]
                ints += ks
            tensors += [cache.k, cache.v, cache.k_scale, cache.v_scale]
            if layer.attn.q_norm is None:
                tensors += [_EMPTY, _EMPTY]
            elif layer.attn.q_norm.weight.dtype != dtype:
                return None
            else:
                tensors += [layer.attn.q_norm.weight.detach(), layer.attn.k_norm.weight.detach()]
        cfg = model.cfg
        attn = model.layers[0].attn
        plan_id = ext.register_layer_plan(tensors, ints, cfg.num_heads, cache_format.pop(),
                                          block_size, cfg.rms_norm_eps, attn.scale,
                                          int4.INT4_KERNEL_MAX_ROWS)  # read now, as forward does
        return cls(model, plan_id)

    @staticmethod
    def accepts(meta: AttentionMetadata) -> bool:
        return len(meta.groups) == 1 and meta.groups[0].block_tables is not None

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata, before_layers: Callable[[], None] | None = None,
                aux_layers: tuple[int, ...] = ()) -> torch.Tensor | tuple[torch.Tensor, list]:
        """What LlamaModel.forward returns: the final normed hidden states [num_tokens, hidden]
        (with aux_layers: and the residual streams after them). before_layers is called right
        before the layers run, which is the GIL-free stretch of the step."""
        m = self.model
        cos, sin = m.rotary.lookup(positions)
        g = meta.groups[0]
        embeds = m.embed_tokens(input_ids)
        if before_layers is not None:
            before_layers()
        x, residual, aux = self._run(self.plan_id, embeds, cos, sin, meta.slot_mapping,
                                     g.block_tables, g.token_seq, g.token_pos,
                                     sorted(aux_layers))
        hidden = m.norm(x, residual)[0]
        return (hidden, aux) if aux_layers else hidden
