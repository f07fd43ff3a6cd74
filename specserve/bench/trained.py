"""Trained drafts for the lab: found in the cache, or trained there when the budget allows.

Without them the lab's draft rows would measure the untrained self-draft (the target's first 4
layers agree with it 1-3% of the time), the straw man issue #8 describes. A draft is trained on
the lab's own workloads (a train / held-out split of their prompts), once per target and method,
and cached under ~/.cache/specserve (never in the repository).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from specserve.bench.workloads import WorkloadItem, load_workload
from specserve.train.save import cached_draft_path, target_fingerprint

logger = logging.getLogger("specserve")

TRAIN_WORKLOADS = "prose,json,sql,rag"
DRAFT_LAYERS = 3


def cached_path(target: str | None, method: str) -> Path:
    """~/.cache/specserve/drafts/<target>-<workloads>-3 (draft) or ...-eagle (eagle); target
    None is the embedded model."""
    base = cached_draft_path(target, TRAIN_WORKLOADS, DRAFT_LAYERS)
    return base if method == "draft" else base.with_name(base.name.rsplit("-", 1)[0] + "-eagle")


def trained_draft(target: str | None, method: str, minutes: float,
                  num_threads: int | None = None) -> Path | None:
    """The cached draft (`method` "draft" or "eagle") for target, training it first when none is
    cached and minutes > 0, or when the cached one had an older recipe, a shorter budget than
    minutes asks for or other weights of the target (save.target_fingerprint); None when there
    is none fit to use and no budget to train one."""
    from specserve.train.pipeline import RECIPE

    path = cached_path(target, method)
    report = path / "training.json"
    if report.is_file():
        trained = json.loads(report.read_text())
        budget = trained.get("settings", {}).get("minutes", 0)
        if trained.get("target_fingerprint") not in (None, target_fingerprint(target)):
            # Trained for other weights under the same path: it would not load (another
            # embedding) or would guess for a model that is gone.
            if minutes <= 0:
                logger.warning("%s was trained for other weights of %s; retrain it with "
                               "--train-minutes > 0", path, target or "the embedded model")
                return None
            logger.info("%s was trained for other weights: training again", path)
        elif trained.get("recipe", 1) >= RECIPE[method] and (minutes <= 0 or budget >= minutes):
            return path
        elif minutes <= 0:
            logger.warning("%s was trained with an older recipe; retrain it with "
                           "--train-minutes > 0", path)
            return path
        else:
            logger.info("%s was trained for %g min (recipe %s): training again for %g min",
                        path, budget, trained.get("recipe", 1), minutes)
    elif minutes <= 0:
        return None
    from specserve.train.data import workload_prompts

    items = workload_prompts(TRAIN_WORKLOADS)
    logger.info("training a %s draft for %.0f min into %s", method, minutes, path)
    if method == "eagle":
        from specserve.train.eagle import EagleConfig
        from specserve.train.pipeline import train_eagle_head

        train_eagle_head(target, items, path, EagleConfig(minutes=minutes),
                         num_threads=num_threads, source=f"workload:{TRAIN_WORKLOADS}")
    else:
        from specserve.train.distill import DistillConfig
        from specserve.train.pipeline import train_draft

        train_draft(target, items, path, DistillConfig(num_layers=DRAFT_LAYERS, minutes=minutes),
                    num_threads=num_threads, source=f"workload:{TRAIN_WORKLOADS}")
    return path


def trained_on(draft: str | Path) -> set[str] | None:
    """The prompt keys (train.data.prompt_key) of every prompt a trained draft was trained on:
    listed in its training.json since session 39; for older drafts, the train side of the
    seeded split train-draft made of its source, made again. An empty set for a directory
    without a report (an untrained draft saw nothing); None where that cannot be told (an
    older report whose prompts file is gone or malformed)."""
    from specserve.train.data import (
        prompt_key,
        read_prompts_jsonl,
        split_by_kind,
        workload_prompts,
    )

    report = Path(draft).expanduser() / "training.json"  # as the loaders read the path
    if not report.is_file():
        return set()
    try:
        info = json.loads(report.read_text())
        if "train_prompt_keys" in info:
            return set(info["train_prompt_keys"])
        kind, _, where = info.get("source", "").partition(":")
        settings = info["settings"]
        items = workload_prompts(where) if kind == "workload" else read_prompts_jsonl(where)
        train, _ = split_by_kind(items, settings["held_out_fraction"], settings["seed"])
    except (KeyError, TypeError, AttributeError, OSError, ValueError):
        return None
    return {prompt_key(p.messages, p.text, p.token_ids) for p in train}


def unseen_items(name: str, drafts: Sequence[str | Path]) -> list[WorkloadItem]:
    """The items of workload `name` that none of `drafts` was trained on. The lab's drafts are
    trained on the lab's own workloads, 85% of whose prompts are train prompts: measured on
    all of them, the EAGLE head's first guess on prose was accepted 0.65 of the time, against
    0.31 on the prompts held out from its training (docs/performance.md, session 39). So the
    lab and the sweep time trained drafts on the held-out prompts."""
    from specserve.train.data import prompt_key

    items = load_workload(name)
    seen: set[str] = set()
    for draft in drafts:
        keys = trained_on(draft)
        if keys is None:
            logger.warning("cannot tell which prompts %s was trained on: its rows may run on "
                           "prompts it has seen", draft)
            continue
        seen |= keys
    unseen = [item for item in items if prompt_key(item.messages) not in seen]
    if not unseen:
        raise ValueError(f"every {name} prompt was used to train {', '.join(map(str, drafts))}: "
                         "no unseen prompts to measure it on (--prompts all runs them anyway)")
    return unseen
