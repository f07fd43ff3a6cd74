"""Rotary position embedding (Su et al. 2021) in Hugging Face's rotate-half layout."""

from __future__ import annotations

import torch

# Rope types whose frequencies do not depend on the sequence length: one table serves every
# position. "dynamic" NTK and "longrope" switch frequencies with the length and are refused.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class RotaryEmbedding:
    def __init__(self, head_dim: int, max_position: int, theta: float, dtype: torch.dtype,
                 device: torch.device | str | None = None,
                 scaling: tuple[tuple[str, object], ...] = ()):
        """scaling: Hugging Face's rope parameters of a scaled rope (rope_type "linear", "llama3"
        or "yarn" and their fields); its frequencies and yarn's attention factor come from
        transformers' own functions, so that they are the reference's."""
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        attention_factor = 1.0
        if scaling:
            inv_freq, attention_factor = scaled_inv_freq(head_dim, max_position, theta,
                                                         dict(scaling))
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)  # [max_position, head_dim]
        # Computed in fp32 and rounded once to the model dtype, as transformers does.
        self.cos = (emb.cos() * attention_factor).to(device=device, dtype=dtype)
        self.sin = (emb.sin() * attention_factor).to(device=device, dtype=dtype)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Once per step: [num_tokens, head_dim] cos and sin, shared by every layer."""
        return self.cos[positions], self.sin[positions]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [..., num_heads, head_dim], cos / sin broadcast to it: x*cos + rotate_half(x)*sin, each
    product rounded to x's dtype, as transformers does (the fused kernel rounds the same way)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def check_rope(params: dict, source: str) -> None:
    """Refuse rope parameters one table cannot serve: a length-dependent rope_type, or a rope
    over part of the head."""
    if params.get("rope_type", "default") not in STATIC_ROPE_TYPES \
            or params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{source}: rope {params} is not supported (rope_type one of "
                         f"{', '.join(STATIC_ROPE_TYPES)}, over the whole head)")


def scaled_inv_freq(head_dim: int, max_position: int, theta: float, params: dict
                    ) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim / 2] in fp32, attention factor) of a scaled rope."""
    import transformers
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    check_rope(params, "rotary embedding")
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        raise ValueError(f"rotary embedding: {params} names no scaled rope")
    if rope_type == "yarn" and int(transformers.__version__.split(".")[0]) < 5:
        # Before 5, transformers took yarn's correction range from max_position_embeddings
        # (here the extended context) or rescaled the factor by it (4.5x): other frequencies
        # than the checkpoint's.
        raise ValueError(f"a yarn rope needs transformers >= 5 (installed: "
                         f"{transformers.__version__})")
    config = LlamaConfig(hidden_size=head_dim, num_attention_heads=1, head_dim=head_dim,
                         max_position_embeddings=max_position, rope_theta=theta,
                         rope_scaling=dict(params))  # read by transformers 4 and 5 alike
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    return inv_freq.float(), float(attention_factor)
