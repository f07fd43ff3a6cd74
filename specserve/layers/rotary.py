"""Rotary position embedding (Su et al. 2021) in Hugging Face's rotate-half layout."""

from __future__ import annotations

import torch


class RotaryEmbedding:
    def __init__(self, head_dim: int, max_position: int, theta: float, dtype: torch.dtype,
                 device: torch.device | str | None = None):
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)  # [max_position, head_dim]
        # Computed in fp32 and rounded once to the model dtype, as transformers does.
        self.cos = emb.cos().to(device=device, dtype=dtype)
        self.sin = emb.sin().to(device=device, dtype=dtype)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Once per step: [num_tokens, head_dim] cos and sin, shared by every layer."""
        return self.cos[positions], self.sin[positions]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [..., num_heads, head_dim], cos / sin broadcast to it: x*cos + rotate_half(x)*sin, each
    product rounded to x's dtype, as transformers does (the fused kernel rounds the same way)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
