"""What a request names to run with an adapter (vLLM's `LoRARequest`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """An adapter: a name for it, a positive id that identifies it in the engine (a second
    request with the same id reuses the loaded weights), and the PEFT directory it is read from
    (adapter_config.json and adapter_model.safetensors)."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if type(self.lora_int_id) is not int or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be a positive integer, not {self.lora_int_id!r}")
