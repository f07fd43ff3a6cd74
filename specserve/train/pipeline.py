"""The whole `train-draft` run: generate the data, distil, report, save."""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from specserve.models.llama import build_model
from specserve.models.loader import load_model
from specserve.spec_decode.eagle_io import save_eagle
from specserve.train.data import DraftData, PromptItem, build_data
from specserve.train.distill import DistillConfig, DistillResult, distill
from specserve.train.eagle import EagleConfig, EagleResult, agreement, eagle_report, train_eagle
from specserve.train.report import acceptance_report, format_report
from specserve.train.save import save_draft


@dataclass(slots=True)
class TrainOutcome:
    path: Path
    result: DistillResult | EagleResult
    acceptance: list[dict]
    report: dict


def generate_data(target: str | None, items: Sequence[PromptItem], max_reply_tokens: int,
                  seed: int, dtype: str, num_threads: int | None) -> DraftData:
    """The target's greedy replies, from the engine as it serves them (same dtype)."""
    from specserve.llm import LLM

    llm = LLM(target, dtype=dtype, seed=seed, num_threads=num_threads)
    try:
        return build_data(llm, items, max_reply_tokens, seed)
    finally:
        del llm
        gc.collect()  # the engine's KV pool is gone before training allocates


def train_draft(target: str | None, items: Sequence[PromptItem], out: str | Path,
                cfg: DistillConfig, max_reply_tokens: int = 128, dtype: str = "bfloat16",
                num_threads: int | None = None, source: str = "") -> TrainOutcome:
    t0 = time.perf_counter()
    if num_threads:
        torch.set_num_threads(num_threads)
    data = generate_data(target, items, max_reply_tokens, cfg.seed, dtype, num_threads)
    # Training runs in fp32 on the target's weights as loaded (dequantized for a GGUF).
    loaded = load_model(target)
    model = build_model(loaded.config, loaded.state_dict, torch.float32)
    result = distill(model, data, cfg)
    acceptance = acceptance_report(model, result.draft, result.held_out)
    report = {
        "method": "draft",
        "target": loaded.name,
        "target_path": loaded.path,
        "source": source,
        "settings": dataclasses.asdict(cfg) | {"max_reply_tokens": max_reply_tokens,
                                               "generation_dtype": dtype},
        "head_vocab_size": result.draft.head_size,
        "train_samples": len(data.train),
        "held_out_samples": len(data.held_out),
        "train_positions": sum(s.reply_len for s in data.train),
        "held_out_positions": sum(it.num_positions for it in result.held_out),
        "steps": result.steps,
        "stop_reason": result.stop_reason,
        "evaluations": result.history,
        "acceptance": acceptance,
        "time_s": {"generation": round(data.generation_time, 3),
                   "prepare": round(result.prepare_time, 3),
                   "train": round(result.train_time, 3),
                   "total": round(time.perf_counter() - t0, 3)},
    }
    path = save_draft(out, result.draft, loaded.name, model.embed_tokens.weight,
                      loaded.tokenizer, report)
    return TrainOutcome(path, result, acceptance, report)


def summary(outcome: TrainOutcome) -> str:
    r = outcome.report
    t = r["time_s"]
    first, last = r["evaluations"][0], r["evaluations"][-1]
    return "\n".join([
        f"trained {r['method']} saved to {outcome.path}",
        f"{r['train_samples']} train / {r['held_out_samples']} held-out replies; "
        f"{r['steps']} steps ({r['stop_reason']}); head {r['head_vocab_size']} ids",
        f"time: generation {t['generation']:.1f}s, prepare {t['prepare']:.1f}s, "
        f"train {t['train']:.1f}s",
        f"held-out agreement {first['held_out_agreement']:.1%} (init) -> "
        f"{last['held_out_agreement']:.1%}",
        format_report(outcome.acceptance),
    ])


def train_eagle_head(target: str | None, items: Sequence[PromptItem], out: str | Path,
                     cfg: EagleConfig, max_reply_tokens: int = 128, dtype: str = "bfloat16",
                     num_threads: int | None = None, source: str = "") -> TrainOutcome:
    t0 = time.perf_counter()
    if num_threads:
        torch.set_num_threads(num_threads)
    data = generate_data(target, items, max_reply_tokens, cfg.seed, dtype, num_threads)
    loaded = load_model(target)
    model = build_model(loaded.config, loaded.state_dict, torch.float32)
    result = train_eagle(model, data.train, data.held_out, cfg)
    acceptance = eagle_report(result.before, agreement(result.head, result.held_out))
    report = {
        "method": "eagle",
        "target": loaded.name,
        "target_path": loaded.path,
        "source": source,
        "settings": dataclasses.asdict(cfg) | {"max_reply_tokens": max_reply_tokens,
                                               "generation_dtype": dtype},
        "head_vocab_size": result.head.head_size,
        "train_samples": len(data.train),
        "held_out_samples": len(data.held_out),
        "train_positions": sum(s.reply_len for s in data.train),
        "held_out_positions": sum(it.num_positions for it in result.held_out),
        "steps": result.steps,
        "stop_reason": result.stop_reason,
        "evaluations": result.history,
        "acceptance": acceptance,
        "acceptance_note": "teacher-forced first-guess agreement (target features as input)",
        "time_s": {"generation": round(data.generation_time, 3),
                   "prepare": round(result.prepare_time, 3),
                   "train": round(result.train_time, 3),
                   "total": round(time.perf_counter() - t0, 3)},
    }
    path = save_eagle(out, result.head, loaded.name, loaded.tokenizer, report)
    return TrainOutcome(path, result, acceptance, report)
