"""Train an EAGLE head (spec_decode/eagle_head.py) for a target within a wall-clock budget.

Data: the target's own replies (train/data.py). The target's final normed hidden state at
every position is computed once and kept (the head reads them as input and predicts them).
At reply position j the head reads (embedding of token j, target feature j - 1) and predicts
feature j; its loss is KL(target || head) over the head's vocabulary ids at the next token (the
target restricted to those ids and renormalised, as in distill.py) plus a small smooth-L1 term
pulling the predicted feature toward the target's, which keeps chained guesses (fed the head's
own features) on track. The input features get a little uniform noise for the same reason
(EAGLE's recipe). Embedding and LM head are the target's and stay frozen; the loop (AdamW,
bf16 autocast, time budget) is train/loop.py.

Two things bought held-out agreement on the embedded model (session 11, same data, 3-minute
budgets; docs/results/2026-12-02-session11):
- fused features (eagle_head.py): the residual streams after a low and a middle target layer
  beside the final feature, 25.3% -> 30.1%;
- a short training context (`head_context`): the target's features are computed over the whole
  (clipped) context, but the head trains over only the last `head_context` prompt positions
  before the reply, since its input features already carry the context. Most of a batch was
  long rag prompts with no loss on them; now most of it is reply positions (after ~150 steps:
  18.7% -> 25.3%).
The layer slots of a share of the inputs (`aux_dropout`) read zeros, as a chained guess's do.
A cross-entropy term on the target's argmax (`top1_loss`, off by default) raised the final
feature's head from 25.3% to 27.4%, but added nothing to fused features (28.8% vs 29.0% at step
150).

Held-out agreement is teacher-forced: the head's argmax at each reply position, given the
target's real features, against the target's greedy token: the acceptance of a first guess. The
head reads the window it is trained and served with (`head_context`): read over whole contexts,
the session-12 head agreed 26.6% of the time on rag's 2.5k-token prompts, 39.5% with the window
(docs/results/2026-12-02-session12/head_window.txt).
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specserve.models.llama import LlamaModel
from specserve.spec_decode.eagle_head import EagleHead, feature_rows, shift_features
from specserve.train.batches import agreement_counts, clip, length_batches
from specserve.train.data import Sample
from specserve.train.dense_forward import dense_hidden_and_streams, pad_batch
from specserve.train.draft_net import select_head_ids
from specserve.train.loop import BudgetConfig, LoopResult, train_within_budget
from specserve.train.report import overall


@dataclass(frozen=True, slots=True)
class EagleConfig(BudgetConfig):
    lr: float = 1e-3
    feature_loss: float = 0.1  # weight of the smooth-L1 feature term
    feature_noise: float = 0.1  # uniform input noise, relative to the features' mean |value|
    top1_loss: float = 0.0  # weight of a cross-entropy on the target's argmax
    # Target layers fused beside the final feature; None: a low and a middle one
    # (default_feature_layers), (): the final feature only (EAGLE-1).
    feature_layers: tuple[int, ...] | None = None
    aux_dropout: float = 0.2  # share of input positions whose layer slots read zeros
    head_context: int | None = 64  # prompt positions before the reply the head trains over

    def __post_init__(self) -> None:
        BudgetConfig.__post_init__(self)
        if not 0 <= self.aux_dropout < 1:
            raise ValueError("aux_dropout must be in [0, 1)")
        if self.head_context is not None and self.head_context < 0:
            raise ValueError("head_context must be >= 0 (None: the whole context)")


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """A low and a middle layer (2 and 14 of SmolLM2's 30), as EAGLE-3 fuses low, middle and
    high (final) features; () for a target too shallow to have both below its last layer."""
    layers = tuple(sorted({min(2, num_layers // 4), num_layers // 2 - 1}))
    return layers if num_layers >= 4 else ()


@dataclass(slots=True)
class Featured:
    kind: str
    token_ids: list[int]
    start: int  # first position whose next token is a reply token
    features: torch.Tensor  # [len(token_ids), hidden]: the target's feature at every position

    @property
    def num_positions(self) -> int:
        return len(self.token_ids) - 1 - self.start


@dataclass(slots=True)
class EagleResult:
    head: EagleHead
    held_out: list[Featured]
    before: dict[str, list[int]]  # per kind, the initial head's agreement counts
    prepare_time: float
    loop: LoopResult


def featurize(target: LlamaModel, samples: Sequence[Sample], max_context: int | None,
              feature_layers: tuple[int, ...] = (), head_context: int | None = None,
              batch_tokens: int = 8192) -> list[Featured]:
    """The target's feature rows (eagle_head.feature_rows) over each sample's (clipped)
    context; with head_context, only the last head_context prompt positions before the reply
    and the reply are kept (features computed over the whole context all the same)."""
    items = [Featured(s.kind, *clip(s, max_context), features=torch.empty(0)) for s in samples]
    with torch.no_grad():
        for idx in length_batches(items, batch_tokens):
            batch = [items[i] for i in idx]
            final, streams = dense_hidden_and_streams(
                target, pad_batch([it.token_ids for it in batch]), feature_layers)
            rows = feature_rows(final, streams)
            for row, it in enumerate(batch):
                # Cut before the copy: a view of the window would keep the whole context's
                # rows alive (~10x the memory on rag prompts).
                cut = 0 if head_context is None else max(it.start - head_context, 0)
                it.features = rows[row, cut:len(it.token_ids)].clone()
                it.token_ids, it.start = it.token_ids[cut:], it.start - cut
    return items


def _padded_features(batch: Sequence[Featured]) -> torch.Tensor:
    out = torch.zeros(len(batch), max(len(it.token_ids) for it in batch),
                      batch[0].features.shape[1])
    for r, it in enumerate(batch):
        out[r, :len(it.token_ids)] = it.features
    return out


def _reply(x: torch.Tensor, batch: Sequence[Featured]) -> torch.Tensor:
    """Rows of x [B, T, ...] at each item's reply positions, concatenated."""
    return torch.cat([x[r, it.start:len(it.token_ids) - 1] for r, it in enumerate(batch)])


def head_outputs(head: EagleHead, batch: Sequence[Featured], noise: float = 0.0,
                 aux_dropout: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(predicted final features, the target's final features) at the batch's reply
    positions."""
    feats = _padded_features(batch)
    inputs = shift_features(feats)
    if noise:
        scale = noise * float(feats.abs().mean())
        inputs = inputs + (torch.rand_like(inputs) * 2 - 1) * scale
    h = head.cfg.hidden_size
    if aux_dropout and inputs.shape[-1] > h:  # as a chained guess reads them: zeros
        keep = torch.rand(*inputs.shape[:2], 1) >= aux_dropout
        inputs = torch.cat([inputs[..., :h], inputs[..., h:] * keep], dim=-1)
    out = head.dense(pad_batch([it.token_ids for it in batch]), inputs)
    return _reply(out, batch), _reply(feats[..., :h], batch)


def agreement(head: EagleHead, items: Sequence[Featured], skip_first: bool = True
              ) -> dict[str, list[int]]:
    """Per kind: [positions where the head's first guess is the target's token, positions],
    the reply's first token left out unless skip_first is False (batches.agreement_counts)."""
    counts: dict[str, list[int]] = {}
    with torch.no_grad():
        for idx in length_batches(items, 8192):
            batch = [items[i] for i in idx]
            pred, _ = head_outputs(head, batch)
            guess = head.to_full_ids(head.compute_logits(pred).argmax(dim=-1))
            labels = torch.tensor([t for it in batch for t in it.token_ids[it.start + 1:]])
            for it, g, lab in zip(batch, guess.split([it.num_positions for it in batch]),
                                  labels.split([it.num_positions for it in batch]), strict=True):
                matched, positions = agreement_counts(g, lab, skip_first)
                c = counts.setdefault(it.kind, [0, 0])
                c[0] += matched
                c[1] += positions
    return counts


def new_head(target: LlamaModel, head_ids: torch.Tensor | None,
             feature_layers: tuple[int, ...] = (), context: int | None = None) -> EagleHead:
    """fc starts as 'take the final feature' plus a small embedding share (the layer slots at
    zero); the layer and the final norm start as copies of the target's last layer and final
    norm."""
    head = EagleHead(target.cfg, target.embed_tokens, target.lm_head.weight, head_ids,
                     torch.float32, feature_layers, context)
    h = target.cfg.hidden_size
    with torch.no_grad():
        fc = torch.zeros(h, h + head.feature_size)
        fc[:, :h], fc[:, h:2 * h] = 0.1 * torch.eye(h), torch.eye(h)
        head.fc.weight.copy_(fc)
    head.layers[0].load_state_dict(copy.deepcopy(target.layers[-1].state_dict()))
    head.norm.load_state_dict(copy.deepcopy(target.norm.state_dict()))
    for module in (head.fc, head.layers, head.norm):
        module.requires_grad_(True)
    return head


def _step_loss(head: EagleHead, target_head: torch.Tensor, batch: Sequence[Featured],
               cfg: EagleConfig) -> torch.Tensor:
    pred, true = head_outputs(head, batch, cfg.feature_noise, cfg.aux_dropout)
    with torch.no_grad():
        target_logits = (true @ target_head.T).float()
        log_p = target_logits.log_softmax(dim=-1)
    logits = head.compute_logits(pred)
    loss = F.kl_div(logits.log_softmax(dim=-1), log_p, log_target=True, reduction="batchmean")
    if cfg.top1_loss:
        loss = loss + cfg.top1_loss * F.cross_entropy(logits, target_logits.argmax(dim=-1))
    return loss + cfg.feature_loss * F.smooth_l1_loss(pred.float(), true.float())


def train_eagle(target: LlamaModel, train: Sequence[Sample], held: Sequence[Sample],
                cfg: EagleConfig, teacher: LlamaModel | None = None) -> EagleResult:
    """Train a head for `target`; `teacher` (default: target) computes the features once: pass
    the target as it is served (bf16), whose features the head reads in serving."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    target.requires_grad_(False)
    t0 = time.perf_counter()
    teacher = teacher if teacher is not None else target
    layers = (default_feature_layers(target.cfg.num_layers) if cfg.feature_layers is None
              else tuple(sorted(set(cfg.feature_layers))))
    train_items = featurize(teacher, train, cfg.max_context, layers, cfg.head_context)
    # the head's window, as it is served (eagle.EagleSeq), over features of the whole prompt
    # (the labels are the target's replies to it)
    held_out = featurize(teacher, held, None, layers, cfg.head_context)
    teacher = None  # its features are cached: free it before training allocates
    h = target.cfg.hidden_size
    reply_rows = torch.cat([it.features[it.start:len(it.token_ids) - 1, :h]
                            for it in train_items])
    if len(reply_rows) > cfg.head_mass_positions:
        keep = sorted(rng.sample(range(len(reply_rows)), cfg.head_mass_positions))
        reply_rows = reply_rows[torch.tensor(keep)]
    head_ids = select_head_ids([reply_rows], target.lm_head.weight.detach(), cfg.head_vocab,
                               always=target.cfg.eos_token_ids)
    head = new_head(target, head_ids, layers, cfg.head_context)
    target_head = target.lm_head.weight.detach()
    if head_ids is not None:
        target_head = target_head[head_ids]
    prepare_time = time.perf_counter() - t0
    before: dict[str, list[int]] = {}

    def evaluate(step: int) -> float:
        head.eval()
        counts = agreement(head, held_out)
        if step == 0:  # the untrained head
            before.update(counts)
        head.train()
        return overall(counts)

    params = [p for p in head.parameters() if p.requires_grad]
    loop = train_within_budget(
        params, list(length_batches(train_items, cfg.batch_tokens)),
        lambda idx: _step_loss(head, target_head, [train_items[i] for i in idx], cfg),
        evaluate, cfg, rng)
    head.eval()
    return EagleResult(head, held_out, before, prepare_time, loop)


def eagle_report(before: dict[str, list[int]], after: dict[str, list[int]]) -> list[dict]:
    """One row per kind, then "all": positions and first-guess agreement before and after."""
    rows = [{"kind": k, "positions": before[k][1], "before": before[k][0] / before[k][1],
             "after": after[k][0] / after[k][1]} for k in before if before[k][1]]
    rows.append({"kind": "all", "positions": sum(c[1] for c in before.values()),
                 "before": overall(before), "after": overall(after)})
    return rows
