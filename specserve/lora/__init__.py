"""LoRA adapters served on top of the base model, many at once in one batch (vLLM's LoRA)."""

from specserve.lora.request import LoRARequest

__all__ = ["LoRARequest"]
