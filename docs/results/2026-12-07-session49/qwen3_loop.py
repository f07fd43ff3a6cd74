"""What the C++ layer loop is worth to a Qwen3 model: Qwen3-0.6B's shapes with random weights
(bf16, 28 layers, 16 x 128 query heads, 8 KV heads, hidden 1024), decoding 64 tokens at
concurrency 1 and 8 on one engine with and without the loop, interleaved rounds.

    HF_HUB_OFFLINE=1 .venv/bin/python docs/results/2026-12-07-session49/qwen3_loop.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROUNDS = 5


def make_qwen3(path: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
    from tiny_models import _tokenizer
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                      num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                      head_dim=128, max_position_embeddings=4096, tie_word_embeddings=True,
                      eos_token_id=1, bos_token_id=None, pad_token_id=0)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path)
    _tokenizer().save_pretrained(path)  # ids only: the prompts are token ids
    return path


def main() -> None:
    from specserve import LLM, SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        path = make_qwen3(Path(tmp) / "qwen3-0.6b-shape")
        llm = LLM(str(path), kv_cache_memory=1 << 30, max_num_seqs=8)
        runner = llm.engine.runner
        loop = runner.layer_loop
        assert loop is not None
        params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
        prompts = [[(17 * i + j) % 60 + 2 for j in range(32)] for i in range(8)]
        llm.generate(prompts[:1], params)  # warm-up
        rates: dict[tuple[str, int], list[float]] = {}
        for r in range(ROUNDS):
            for conc in (1, 8):
                for name in (("loop", "python") if r % 2 == 0 else ("python", "loop")):
                    runner.layer_loop = loop if name == "loop" else None
                    llm.engine.reset_prefix_cache()
                    t = time.perf_counter()
                    outs = llm.generate(prompts[:conc], params)
                    dt = time.perf_counter() - t
                    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
                    rates.setdefault((name, conc), []).append(tokens / dt)
        for conc in (1, 8):
            loop_r, py_r = rates[("loop", conc)], rates[("python", conc)]
            ratios = [a / b for a, b in zip(loop_r, py_r, strict=True)]
            print(f"c{conc}: loop {statistics.median(loop_r):.1f} tok/s, python "
                  f"{statistics.median(py_r):.1f} tok/s, per-round loop/python "
                  f"{' / '.join(f'{x:.3f}' for x in ratios)} (median "
                  f"{statistics.median(ratios):.3f})")


if __name__ == "__main__":
    main()
