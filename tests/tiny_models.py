"""Tiny random Llama / Qwen2 / Qwen3 checkpoints written as Hugging Face directories (config.json,
safetensors, tokenizer), so tests exercise the real loading path and can compare against
transformers without any download."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 64


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1} | {f"w{i}": i for i in range(2, VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


def make_tiny_model(path: Path, arch: str = "llama", seed: int = 0, num_layers: int = 2,
                    vocab_size: int = VOCAB, logit_scale: float = 1.0,
                    hidden_size: int = 64, max_shard_size: str | None = None,
                    **config) -> Path:
    """Write a random model to path. logit_scale multiplies the LM head, to make the
    distributions sharper (it is a separate, untied head); config: more config fields
    (rope_scaling, attention_bias, ...); max_shard_size: save in shards with an index."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=128,
                  num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  eos_token_id=1, bos_token_id=None, pad_token_id=0) | config
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(rope_theta=10000.0, **common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(rope_theta=10000.0, **common))
    else:  # qwen3: q/k norms, and heads wider than hidden / heads (Qwen3-0.6B: 16 x 128, 1024)
        model = Qwen3ForCausalLM(Qwen3Config(rope_theta=10000.0, **({"head_dim": 32} | common)))
    with torch.no_grad():
        for p in model.parameters():  # larger weights than the default init: peaky outputs
            p.normal_(0, 0.2)
        model.lm_head.weight.mul_(logit_scale)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    _tokenizer().save_pretrained(path)
    return path
