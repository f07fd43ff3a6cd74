"""Distil the target into a small draft within a wall-clock budget.

Loss: KL(target || draft) at every reply position, over the draft's head ids. The draft puts no
probability outside its head, so the target's distribution is restricted to the head ids and
renormalised first (KL against the unrestricted target would be infinite); with the full head
this is the plain KL. The target's side is fixed (hidden states cached in batches.prepare, from
the teacher: the target in the dtype it is served in), the embedding is the target's and stays
frozen, everything else in the draft trains (train/loop.py: AdamW, bf16 autocast, time budget).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specserve.models.llama import LlamaModel
from specserve.train.batches import Prepared, length_batches, prepare, reply_rows
from specserve.train.data import DraftData
from specserve.train.dense_forward import pad_batch
from specserve.train.draft_net import DraftNet, select_head_ids
from specserve.train.loop import BudgetConfig, LoopResult, train_within_budget
from specserve.train.report import draft_predictor, greedy_agreement, overall


@dataclass(frozen=True, slots=True)
class DistillConfig(BudgetConfig):
    num_layers: int = 3


@dataclass(slots=True)
class DistillResult:
    draft: DraftNet
    held_out: list[Prepared]
    prepare_time: float  # target hidden states and head selection
    loop: LoopResult


def _mass_rows(items: list[Prepared], limit: int, rng: random.Random) -> list[torch.Tensor]:
    """The target hidden states of at most `limit` reply positions, sampled without bias."""
    rows = torch.cat([it.target_hidden for it in items])
    if len(rows) > limit:
        rows = rows[torch.tensor(sorted(rng.sample(range(len(rows)), limit)))]
    return [rows]


def _step_loss(target: LlamaModel, draft: DraftNet, target_head: torch.Tensor,
               batch: list[Prepared]) -> torch.Tensor:
    ids = pad_batch([it.token_ids for it in batch])
    with torch.no_grad():
        embeds = target.embed_tokens(ids)
        hidden = torch.cat([it.target_hidden for it in batch]).to(target_head.dtype)
        log_p = (hidden @ target_head.T).float().log_softmax(dim=-1)
    log_q = draft(reply_rows(draft.hidden(embeds), batch)).log_softmax(dim=-1)
    return F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")


def distill(target: LlamaModel, data: DraftData, cfg: DistillConfig,
            teacher: LlamaModel | None = None) -> DistillResult:
    """Train a draft from `target`'s first layers (fp32 master weights). `teacher` (default:
    target) computes the target's hidden states once: pass the model as it is served (bf16)."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    target.requires_grad_(False)
    t0 = time.perf_counter()
    train = prepare(teacher if teacher is not None else target, data.train, cfg.max_context,
                    with_hidden=True)
    # Held-out prompts are read whole, as served: their labels are the target's replies to the
    # whole prompt, which a clipped rag document could not predict.
    held_out = prepare(target, data.held_out, None, with_hidden=False)
    teacher = None  # its hidden states are cached: free it before training allocates
    head_ids = select_head_ids(_mass_rows(train, cfg.head_mass_positions, rng),
                               target.lm_head.weight.detach(), cfg.head_vocab,
                               always=target.cfg.eos_token_ids)
    draft = DraftNet(target, cfg.num_layers, head_ids)
    # The target's own logits over the head ids: a fixed slice of its LM head.
    target_head = target.lm_head.weight.detach()
    if head_ids is not None:
        target_head = target_head[head_ids]
    prepare_time = time.perf_counter() - t0

    def evaluate(step: int) -> float:
        draft.eval()
        agreement = overall(greedy_agreement(draft_predictor(target, draft), held_out))
        draft.train()
        return agreement

    loop = train_within_budget(
        draft.parameters(), list(length_batches(train, cfg.batch_tokens)),
        lambda idx: _step_loss(target, draft, target_head, [train[i] for i in idx]),
        evaluate, cfg, rng)
    draft.eval()
    return DistillResult(draft, held_out, prepare_time, loop)
