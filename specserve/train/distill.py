"""Distil the target into a small draft within a wall-clock budget.

Loss: KL(target || draft) at every reply position, over the draft's head ids. The draft puts no
probability outside its head, so the target's distribution is restricted to the head ids and
renormalised first (KL against the unrestricted target would be infinite); with the full head
this is the plain KL. The target's side is fixed (hidden states cached in batches.prepare), the
embedding is the target's and stays frozen, everything else in the draft trains (AdamW).

The budget is checked before every step: a step starts only if it and the final evaluation are
expected to end before the deadline (from the last step's and the last evaluation's times).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from specserve.models.llama import LlamaModel
from specserve.train.batches import Prepared, length_batches, prepare, reply_rows
from specserve.train.data import DraftData
from specserve.train.dense_forward import pad_batch
from specserve.train.draft_net import DraftNet, select_head_ids
from specserve.train.progress import TrainProgress
from specserve.train.report import draft_predictor, greedy_agreement, overall


@dataclass(frozen=True, slots=True)
class DistillConfig:
    num_layers: int = 3
    head_vocab: int = 8192  # 0: the full vocabulary
    minutes: float = 5.0  # budget of the optimisation loop (evaluations included)
    seed: int = 0
    lr: float = 5e-4
    weight_decay: float = 0.0
    warmup_steps: int = 10
    batch_tokens: int = 4096  # padded tokens per training batch
    eval_every: int = 20  # steps between held-out evaluations
    max_context: int | None = 1024  # prompt tokens beyond this are dropped (batches.clip)
    head_mass_positions: int = 16384  # reply positions sampled to rank the head's ids
    max_steps: int | None = None
    show_progress: bool = True

    def __post_init__(self) -> None:
        if self.minutes <= 0:
            raise ValueError("minutes must be > 0")
        if self.head_vocab < 0:
            raise ValueError("head_vocab must be >= 0 (0: the full vocabulary)")
        if self.eval_every < 1 or self.batch_tokens < 1:
            raise ValueError("eval_every and batch_tokens must be >= 1")


@dataclass(slots=True)
class DistillResult:
    draft: DraftNet
    held_out: list[Prepared]
    history: list[dict] = field(default_factory=list)  # one entry per evaluation
    steps: int = 0
    prepare_time: float = 0.0  # target hidden states and head selection
    train_time: float = 0.0
    stop_reason: str = "time"


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
        log_p = (torch.cat([it.target_hidden for it in batch]) @ target_head.T).float()
        log_p = log_p.log_softmax(dim=-1)
    log_q = draft(reply_rows(draft.hidden(embeds), batch)).log_softmax(dim=-1)
    return F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")


def distill(target: LlamaModel, data: DraftData, cfg: DistillConfig) -> DistillResult:
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    target.requires_grad_(False)
    t0 = time.perf_counter()
    train = prepare(target, data.train, cfg.max_context, with_hidden=True)
    held_out = prepare(target, data.held_out, cfg.max_context, with_hidden=False)
    head_ids = select_head_ids(_mass_rows(train, cfg.head_mass_positions, rng),
                               target.lm_head.weight.detach(), cfg.head_vocab)
    draft = DraftNet(target, cfg.num_layers, head_ids)
    # The target's own logits over the head ids: a fixed slice of its LM head.
    target_head = target.lm_head.weight.detach()
    if head_ids is not None:
        target_head = target_head[head_ids]
    result = DistillResult(draft, held_out, prepare_time=time.perf_counter() - t0)

    opt = torch.optim.AdamW(draft.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(cfg.warmup_steps, 1)))
    batches = list(length_batches(train, cfg.batch_tokens))
    order: list[list[int]] = []
    budget = cfg.minutes * 60
    start = time.perf_counter()
    deadline = start + budget
    losses: list[float] = []

    def evaluate(step: int) -> float:
        t = time.perf_counter()
        draft.eval()
        agreement = overall(greedy_agreement(draft_predictor(target, draft), held_out))
        draft.train()
        mean_loss = sum(losses) / len(losses) if losses else None
        result.history.append({"step": step, "time": round(t - start, 3), "loss": mean_loss,
                               "held_out_agreement": agreement})
        losses.clear()
        return time.perf_counter() - t

    with TrainProgress(budget, cfg.show_progress) as progress:
        eval_cost = evaluate(0)  # the untrained draft's agreement, the baseline
        progress.update(start, 0, None, result.history[-1]["held_out_agreement"])
        step_cost, step = 0.0, 0
        while True:
            if cfg.max_steps is not None and step >= cfg.max_steps:
                result.stop_reason = "max_steps"
                break
            # Start a step only if it and the final evaluation should end by the deadline.
            if time.perf_counter() + step_cost + eval_cost > deadline:
                break
            t = time.perf_counter()
            if not order:  # a new epoch: the same length-sorted batches, in a new order
                order = batches[:]
                rng.shuffle(order)
            loss = _step_loss(target, draft, target_head, [train[i] for i in order.pop()])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            losses.append(float(loss.detach()))
            step_cost = time.perf_counter() - t
            if step % cfg.eval_every == 0:
                eval_cost = evaluate(step)
            last = result.history[-1]
            progress.update(start, step, losses[-1] if losses else last["loss"],
                            last["held_out_agreement"])
        if result.history[-1]["step"] != step:
            evaluate(step)
        progress.update(start, step, result.history[-1]["loss"],
                        result.history[-1]["held_out_agreement"])
    result.steps = step
    result.train_time = time.perf_counter() - start
    draft.eval()
    return result
