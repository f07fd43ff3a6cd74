"""Greedy agreement of a draft with its target on held-out replies, per workload kind.

Agreement is the fraction of reply positions where the draft's argmax is the target's greedy
token. It is what greedy speculation accepts position by position (a run of agreements is an
accepted prefix). The reply's first token is left out: the target's prefill emits it, and no
draft ever guesses it when serving (it is often formulaic, "{" or "SELECT", and would flatter
the figure). So "before" (the plain self-draft of the same N layers, full LM head) against
"after" (the trained draft) says how much the training bought for each kind of prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specserve.models.llama import LlamaModel
from specserve.train.batches import Predictor, Prepared, agreement_counts, predict_rows
from specserve.train.dense_forward import dense_layers
from specserve.train.draft_net import DraftNet


def self_draft_predictor(target: LlamaModel, num_layers: int) -> Predictor:
    """The untrained self-draft: the target's first layers, its final norm and full head."""
    return Predictor(
        hidden=lambda ids: target.norm(dense_layers(target.layers[:num_layers],
                                                    target.embed_tokens(ids), target.rotary)),
        argmax=lambda rows: target.lm_head(rows).argmax(dim=-1))


def draft_predictor(target: LlamaModel, draft: DraftNet) -> Predictor:
    return Predictor(hidden=lambda ids: draft.hidden(target.embed_tokens(ids)),
                     argmax=lambda rows: draft.to_full_ids(draft(rows).argmax(dim=-1)))


def greedy_agreement(predict: Predictor, items: Sequence[Prepared]) -> dict[str, list[int]]:
    """Per kind: [matching positions, positions], the reply's first token left out."""
    counts: dict[str, list[int]] = {}
    for item, pred in predict_rows(predict, items):
        matched, positions = agreement_counts(pred, torch.tensor(item.labels))
        c = counts.setdefault(item.kind, [0, 0])
        c[0] += matched
        c[1] += positions
    return counts


def overall(counts: dict[str, list[int]]) -> float:
    total = sum(c[1] for c in counts.values())
    return sum(c[0] for c in counts.values()) / total if total else 0.0


def acceptance_report(target: LlamaModel, draft: DraftNet,
                      held_out: Sequence[Prepared]) -> list[dict]:
    """One row per kind, then "all": positions and agreement before and after training."""
    before = greedy_agreement(self_draft_predictor(target, draft.cfg.num_layers), held_out)
    after = greedy_agreement(draft_predictor(target, draft), held_out)
    rows = [{"kind": k, "positions": before[k][1], "before": before[k][0] / before[k][1],
             "after": after[k][0] / after[k][1]} for k in before if before[k][1]]
    rows.append({"kind": "all", "positions": sum(c[1] for c in before.values()),
                 "before": overall(before), "after": overall(after)})
    return rows


def format_report(rows: list[dict]) -> str:
    lines = [f"{'workload':<12} {'positions':>9} {'self-draft':>10} {'trained':>8}"]
    lines += [f"{r['kind']:<12} {r['positions']:>9} {r['before']:>10.1%} {r['after']:>8.1%}"
              for r in rows]
    return "\n".join(lines)
