"""One layer's paged KV pool: slots `[num_blocks * block_size, num_kv_heads, head_dim]`.

8-bit pools (`int8`, `fp8_e4m3`) store each token's K and V per head with a bf16 scale
(amax / qmax), written on the fly: no calibration, no clipping. The scales cost 2 bytes per 64
values, so an 8-bit pool holds ~1.94x the blocks of a bf16 one at the same byte budget.
Attention reads a pool through `gather`, which returns values in the model's dtype.
"""

from __future__ import annotations

import torch

# "fp8" is vLLM's name for fp8_e4m3.
KV_CACHE_DTYPES = ("auto", "bfloat16", "bf16", "float32", "fp32", "int8", "fp8", "fp8_e4m3")
_QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}


def resolve_kv_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown kv_cache_dtype {name!r}; choose one of {KV_CACHE_DTYPES}")
    return {"auto": model_dtype, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
            "float32": torch.float32, "fp32": torch.float32, "int8": torch.int8,
            "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}[name]


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                       dtype: torch.dtype) -> int:
    """K and V of one token over all layers, scales included."""
    per_head = head_dim * dtype.itemsize + (2 if dtype in _QMAX else 0)
    return 2 * num_layers * num_kv_heads * per_head


def quantize_kv(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [n, heads, head_dim] -> (values in dtype, bf16 scales [n, heads, 1])."""
    scale = (x.abs().amax(dim=-1, keepdim=True).float() / _QMAX[dtype]).clamp(min=1e-12)
    scale = scale.to(torch.bfloat16)  # quantize against the scale actually stored
    y = x.float() / scale.float()
    if dtype == torch.int8:
        y = y.round_().clamp_(-127, 127)
    return y.to(dtype), scale


class LayerKVCache:
    def __init__(self, num_slots: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 compute_dtype: torch.dtype, device: torch.device | str = "cpu"):
        shape = (num_slots, num_kv_heads, head_dim)
        self.dtype = dtype
        self.compute_dtype = compute_dtype
        # fp8 is kept as raw bytes: CPU index_copy_/index_select do not take float8 tensors.
        self.storage_dtype = torch.uint8 if dtype == torch.float8_e4m3fn else dtype
        self.k = torch.zeros(shape, dtype=self.storage_dtype, device=device)
        self.v = torch.zeros(shape, dtype=self.storage_dtype, device=device)
        self.quantized = dtype in _QMAX
        # How the fused attention kernel reads this pool: 0 in the model dtype, 1 int8, 2 fp8.
        self.kernel_format = {torch.int8: 1, torch.float8_e4m3fn: 2}.get(dtype, 0)
        # Per (slot, head) bf16 scales of an 8-bit pool; empty otherwise (the kernels' "none").
        self.k_scale = self.v_scale = torch.empty(0, dtype=torch.bfloat16, device=device)
        if self.quantized:
            self.k_scale = torch.zeros(num_slots, num_kv_heads, 1, dtype=torch.bfloat16,
                                       device=device)
            self.v_scale = torch.zeros(num_slots, num_kv_heads, 1, dtype=torch.bfloat16,
                                       device=device)

    @property
    def nbytes(self) -> int:
        total = self.k.nbytes + self.v.nbytes
        return total + (self.k_scale.nbytes + self.v_scale.nbytes if self.quantized else 0)

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [n, num_kv_heads, head_dim] for the slots [n]."""
        if not self.quantized:
            self.k.index_copy_(0, slots, k.to(self.dtype))
            self.v.index_copy_(0, slots, v.to(self.dtype))
            return
        for cache, scales, x in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            values, scale = quantize_kv(x, self.dtype)
            cache.index_copy_(0, slots, values.view(self.storage_dtype))
            scales.index_copy_(0, slots, scale)

    def gather(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[len(slots), num_kv_heads, head_dim] K and V in the compute dtype."""
        k, v = self.k.index_select(0, slots), self.v.index_select(0, slots)
        if not self.quantized:
            return k.to(self.compute_dtype), v.to(self.compute_dtype)
        k, v = k.view(self.dtype), v.view(self.dtype)
        ks, vs = self.k_scale.index_select(0, slots), self.v_scale.index_select(0, slots)
        # fp16 cannot hold a small row's bf16 scale (below ~6e-5 it is subnormal, then 0):
        # scale in fp32 there. bf16 and fp32 round the product alike either way.
        work = torch.float32 if self.compute_dtype == torch.float16 else self.compute_dtype
        return ((k.to(work) * ks.to(work)).to(self.compute_dtype),
                (v.to(work) * vs.to(work)).to(self.compute_dtype))
