"""The whole `train-draft` run: generate the data, distil, report, save."""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from specserve.config import ModelConfig, parse_dtype
from specserve.layers.linear import pack_linears
from specserve.models.llama import LlamaModel, build_model
from specserve.models.loader import load_model
from specserve.spec_decode.eagle_head import check_feature_layers
from specserve.spec_decode.eagle_io import save_eagle
from specserve.train.data import (
    DataConfig,
    DraftData,
    PromptItem,
    build_data,
    split_by_kind,
    unique_prompts,
)
from specserve.train.distill import DistillConfig, DistillResult, distill
from specserve.train.draft_net import check_draft_layers
from specserve.train.eagle import EagleConfig, EagleResult, agreement, eagle_report, train_eagle
from specserve.train.loop import autocast
from specserve.train.report import acceptance_report, format_report
from specserve.train.save import calibration_sample, save_draft, target_fingerprint
from specserve.train.whole_dir import check_draft_dir

# Bumped, per method, when the training recipe changes enough that cached drafts should be
# retrained: 2 = several replies per training prompt, bf16 teacher and autocast (session 3);
# eagle 3 = fused layer features and a short training context (session 11); draft 3 = a sample
# of the training sequences saved for int4 calibration (session 20); 4 = the end-of-sequence
# ids always in the reduced head (session 48).
RECIPE = {"draft": 4, "eagle": 4}


@dataclass(slots=True)
class TrainOutcome:
    path: Path
    result: DistillResult | EagleResult
    acceptance: list[dict]
    report: dict


def generate_data(target: str | None, items: Sequence[PromptItem], data_cfg: DataConfig,
                  seed: int, num_threads: int | None,
                  check: Callable[[ModelConfig], None] = lambda cfg: None,
                  show_progress: bool = False) -> DraftData:
    """The target's replies, from the engine as it serves them (same dtype). The prompts'
    split, then check(target config), run first: what cannot work fails before the target
    loads or minutes of generation, not after."""
    from specserve.llm import LLM

    split_by_kind(unique_prompts(items), data_cfg.held_out_fraction, seed)
    llm = LLM(target, dtype=data_cfg.dtype, seed=seed, num_threads=num_threads)
    try:
        check(llm.engine.model_config)
        return build_data(llm, items, data_cfg, seed, use_tqdm=show_progress)
    finally:
        del llm
        gc.collect()  # the engine's KV pool is gone before training allocates


def _data_and_target(target: str | None, items: Sequence[PromptItem], out: str | Path,
                     data_cfg: DataConfig, cfg: DistillConfig | EagleConfig,
                     num_threads: int | None, check: Callable[[ModelConfig], None]):
    """--out checked and the target's fingerprint taken (of the weights the run reads, not
    later ones), before the run; the training data (from the engine, which is gone afterwards,
    and which runs check on the target's config first), then the target loaded again in fp32:
    (data, loaded, model, fingerprint), the model being what the draft is built from."""
    check_draft_dir(Path(out).expanduser(), preflight=True)
    fingerprint = target_fingerprint(target)
    if num_threads:
        torch.set_num_threads(num_threads)
    data = generate_data(target, items, data_cfg, cfg.seed, num_threads, check,
                         cfg.show_progress)
    loaded = load_model(target)
    return data, loaded, build_model(loaded.config, loaded.state_dict, torch.float32), fingerprint


def _teacher(loaded, model: LlamaModel, dtype: str) -> LlamaModel:
    """The target in the dtype it is served in: its hidden states are what the draft learns
    from (and, for EAGLE, what the head reads in serving). The fp32 `model` when that is it."""
    served = parse_dtype(dtype)
    teacher = model
    if served != torch.float32:
        teacher = build_model(loaded.config, loaded.state_dict, served).requires_grad_(False)
        pack_linears(teacher)  # as served: a CPU without bf16 GEMMs needs the packed (fp32) path
    # The models hold what they need: a second copy of the target (fp32 for a GGUF) would
    # stay in memory for the whole training.
    loaded.state_dict.clear()
    return teacher


def _report(method: str, loaded, cfg, data_cfg: DataConfig, data: DraftData,
            result: DistillResult | EagleResult, head_size: int, acceptance: list[dict],
            source: str, t0: float, fingerprint: str) -> dict:
    loop = result.loop
    return {
        "method": method,
        "target": loaded.name,
        "target_path": loaded.path,
        "source": source,
        "target_fingerprint": fingerprint,
        "recipe": RECIPE[method],
        "settings": dataclasses.asdict(cfg) | dataclasses.asdict(data_cfg),
        "head_vocab_size": head_size,
        "train_samples": len(data.train),
        "held_out_samples": len(data.held_out),
        "train_prompt_keys": data.train_prompt_keys,
        "train_positions": sum(s.reply_len for s in data.train),
        "held_out_positions": sum(it.num_positions for it in result.held_out),
        "steps": loop.steps,
        "stop_reason": loop.stop_reason,
        "evaluations": loop.history,
        "acceptance": acceptance,
        "time_s": {"generation": round(data.generation_time, 3),
                   "prepare": round(result.prepare_time, 3),
                   "train": round(loop.train_time, 3),
                   "total": round(time.perf_counter() - t0, 3)},
    }


def train_draft(target: str | None, items: Sequence[PromptItem], out: str | Path,
                cfg: DistillConfig, data_cfg: DataConfig | None = None,
                num_threads: int | None = None, source: str = "") -> TrainOutcome:
    t0 = time.perf_counter()
    data_cfg = data_cfg or DataConfig()
    data, loaded, model, fingerprint = _data_and_target(
        target, items, out, data_cfg, cfg, num_threads,
        lambda target_cfg: check_draft_layers(cfg.num_layers, target_cfg.num_layers))
    result = distill(model, data, cfg, _teacher(loaded, model, data_cfg.dtype))
    with autocast(cfg):
        acceptance = acceptance_report(model, result.draft, result.held_out)
    report = _report("draft", loaded, cfg, data_cfg, data, result, result.draft.head_size,
                     acceptance, source, t0, fingerprint)
    path = save_draft(out, result.draft, loaded.name, model.embed_tokens.weight,
                      loaded.tokenizer, report, calibration_sample(data.train, cfg.seed))
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
                     cfg: EagleConfig, data_cfg: DataConfig | None = None,
                     num_threads: int | None = None, source: str = "") -> TrainOutcome:
    t0 = time.perf_counter()
    data_cfg = data_cfg or DataConfig()
    data, loaded, model, fingerprint = _data_and_target(
        target, items, out, data_cfg, cfg, num_threads,
        lambda target_cfg: check_feature_layers(cfg.feature_layers or (), target_cfg.num_layers))
    result = train_eagle(model, data.train, data.held_out, cfg,
                         _teacher(loaded, model, data_cfg.dtype))
    with torch.no_grad(), autocast(cfg):
        acceptance = eagle_report(result.before, agreement(result.head, result.held_out))
    report = _report("eagle", loaded, cfg, data_cfg, data, result, result.head.head_size,
                     acceptance, source, t0, fingerprint)
    report["acceptance_note"] = "teacher-forced first-guess agreement (target features as input)"
    path = save_eagle(out, result.head, loaded.name, loaded.tokenizer, report)
    return TrainOutcome(path, result, acceptance, report)
