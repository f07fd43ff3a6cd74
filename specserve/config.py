"""Configuration dataclasses. The CLI and the offline API only build these."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
           "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


def parse_dtype(dtype: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """A dtype setting as a torch dtype. "auto" is bf16 on CUDA GPUs that have it (fp16 on
    older ones: a T4 or V100 emulates bf16, as vLLM falls back too) and on CPUs where bf16 beats
    fp32 (native bf16 GEMMs, or AVX2 for our small-row kernel), fp32 on other CPUs
    (specserve/hardware.py says why)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        from specserve.hardware import cpu_runs_bf16_well

        if torch.device(device).type == "cuda":
            with torch.cuda.device(torch.device(device)):
                # including_emulation=False: by default torch counts bf16 emulated on a T4 or
                # V100 as supported.
                native = torch.cuda.is_bf16_supported(including_emulation=False)
                return torch.bfloat16 if native else torch.float16
        return torch.bfloat16 if cpu_runs_bf16_well() else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(_DTYPES)} or 'auto'")
    return _DTYPES[dtype]


# Weight-only integer modes: torch's int8pack / int4pack kernels run with bf16 activations (with
# fp32 ones they are 10-50x slower), so their "auto" dtype is bf16 whatever the CPU.
INT_WEIGHT_METHODS = ("int8", "int4", "gguf")
QUANTIZATION_METHODS = (*INT_WEIGHT_METHODS, "fp8")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape of a Llama/Qwen2/Qwen3-style decoder, read from config.json or GGUF metadata."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    attention_bias: bool = False  # Qwen2 has a bias on q/k/v
    qk_norm: bool = False  # Qwen3: an RMSNorm over each query and key head, before rope
    eos_token_ids: tuple[int, ...] = ()
    architecture: str = "llama"
    # A scaled rope (Llama 3.1's "llama3", "linear", "yarn"): Hugging Face's rope parameters
    # besides rope_theta, as (key, value) pairs; empty for the default rope.
    rope_scaling: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def parse_memory_size(value: str) -> int | float:
    """'1GiB', '512MiB', '2e9' (bytes) or '0.3' (a fraction of free memory)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)\s*([KMGT]i?B)?\s*", value)
    if not m:
        raise ValueError(f"cannot read memory size {value!r}: expected e.g. '2GiB', '512MiB', "
                         "a number of bytes, or a fraction of free memory in (0, 1]")
    number, unit = float(m.group(1)), m.group(2)
    if unit is None:
        if 1 < number and not number.is_integer():  # "1.5": neither bytes nor a fraction
            raise ValueError(f"cannot read memory size {value!r}: a fraction of free memory "
                             "must be in (0, 1], a number of bytes a whole number")
        return number if number <= 1 else int(number)
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit[0]]
    return int(number * scale)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    block_size: int = 16
    # Bytes for the KV pool ('2GiB' is read too); a float in (0, 1] is a fraction of the
    # machine's free memory.
    kv_cache_memory: int | float | str = 1 << 30
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    num_blocks: int | None = None  # overrides kv_cache_memory (tests use it to force preemption)

    def __post_init__(self) -> None:
        from specserve.layers.kv_cache import KV_CACHE_DTYPES

        # Checked here, before the weights are read (minutes for a large model), not after.
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"unknown kv_cache_dtype {self.kv_cache_dtype!r}; choose one of "
                             f"{KV_CACHE_DTYPES}")
        if isinstance(self.kv_cache_memory, str):  # LLM(kv_cache_memory="2GiB"), as on the CLI
            object.__setattr__(self, "kv_cache_memory", parse_memory_size(self.kv_cache_memory))
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if isinstance(self.kv_cache_memory, float) and not 0 < self.kv_cache_memory <= 1:
            raise ValueError("kv_cache_memory as a fraction must be in (0, 1]")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 2048  # token budget of one step
    max_num_seqs: int = 128
    long_prefill_token_threshold: int = 512  # a prefill chunk is at most this long
    # vLLM's: "fcfs" (arrival order) or "priority" (each request's priority, lower first, then
    # arrival; it also picks preemption victims). See engine/scheduler.py.
    scheduling_policy: str = "fcfs"
    # vLLM's max_loras: how many distinct LoRA adapters the running requests may use at once
    # (each is a group of its own in every LoRA linear); a request whose adapter would exceed
    # it waits, keeping its place. None: no limit.
    max_loras: int | None = None

    def __post_init__(self) -> None:
        if min(self.max_num_batched_tokens, self.max_num_seqs,
               self.long_prefill_token_threshold) < 1:
            raise ValueError("max_num_batched_tokens, max_num_seqs and "
                             "long_prefill_token_threshold must be >= 1")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', not "
                             f"{self.scheduling_policy!r}")
        if self.max_loras is not None and (type(self.max_loras) is not int
                                           or self.max_loras < 1):
            raise ValueError(f"max_loras must be a positive integer or None, not "
                             f"{self.max_loras!r}")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str | None = None  # None: the embedded SmolLM2-135M-Instruct GGUF
    # "auto": bf16 where the hardware runs it well (nearly every x86-64 CPU, CUDA), else fp32;
    # or bfloat16 | float32.
    dtype: str = "auto"
    # Where weights and KV pools live: "cpu", "cuda" or "cuda:N". Scheduling, sampling and the
    # n-gram proposer stay on the host (see docs/performance.md, "The CUDA path").
    device: str = "cpu"
    quantization: str | None = None
    seed: int = 0
    num_threads: int | None = None
    speculative_config: dict | None = None
    # off | static | batch-threshold:N | schedule:B=K,... | adaptive (see spec_decode/policy.py)
    speculation_policy: str = "adaptive"
    # Most grammar-forced tokens a structured-output request verifies as drafts per step
    # (jump-forward, sample/grammar.py); 0 turns them off. They need no speculative_config.
    jump_forward_tokens: int = 8
    # Default sampling for requests that leave a parameter unset: "auto" reads the model
    # directory's generation_config.json (vLLM's default), "vllm" ignores it, or a folder.
    generation_config: str = "auto"
    # The longest context (prompt plus output) a request may have; None: the model's, as far
    # as the KV pool holds it. vLLM's max_model_len.
    max_model_len: int | None = None
    # A Jinja chat template, or a file holding one, for a tokenizer that has none (a base
    # model) or to replace its own. vLLM's --chat-template.
    chat_template: str | None = None
    # LoRA adapters (vLLM's enable_lora / max_lora_rank): requests may name a PEFT adapter
    # (specserve/lora), applied on top of the base weights for their rows of each step.
    enable_lora: bool = False
    max_lora_rank: int = 16
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self) -> None:
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2 (a prompt token and an output token)")
        if self.max_lora_rank < 1:
            raise ValueError("max_lora_rank must be >= 1")
        if self.jump_forward_tokens < 0:
            raise ValueError("jump_forward_tokens must be >= 0 (0 turns jump-forward drafts off)")
        if self.dtype != "auto":
            parse_dtype(self.dtype)
        if self.quantization is not None and self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(f"unknown quantization {self.quantization!r}; choose one of "
                             f"{QUANTIZATION_METHODS}")
        device = torch.device(self.device)  # raises on a malformed name
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda[:N], got {self.device!r}")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch sees no CUDA device (this torch build: "
                             f"{torch.__version__})")

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto" and self.quantization in INT_WEIGHT_METHODS and \
                torch.device(self.device).type == "cpu":
            return torch.bfloat16  # the int8 / int4 kernels take bf16 activations on any CPU
        return parse_dtype(self.dtype, self.device)
