"""Samples prepared for training: clipped context, the target's hidden states cached once, and
length-sorted batches.

The target's final hidden states at the reply positions are computed once per sample and kept:
the target is the expensive half of distillation (all its layers against the draft's few), and
its output never changes. Its logits over the draft's head ids are then one small matmul.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from specserve.models.llama import LlamaModel
from specserve.train.data import Sample
from specserve.train.dense_forward import dense_hidden, pad_batch


@dataclass(slots=True)
class Prepared:
    kind: str
    token_ids: list[int]  # the (clipped) prompt + reply
    start: int  # first position whose next token is a reply token
    # [reply_len, hidden]: the target's final normed hidden state at each such position
    target_hidden: torch.Tensor | None = None

    @property
    def labels(self) -> list[int]:
        """The target's greedy tokens (the reply), one per predicted position."""
        return self.token_ids[self.start + 1:]

    @property
    def num_positions(self) -> int:
        return len(self.token_ids) - 1 - self.start


def clip(sample: Sample, max_context: int | None) -> tuple[list[int], int]:
    """Drop prompt tokens from the left so prompt + reply fits max_context (never the reply,
    and at least one prompt token stays). Long rag prompts would otherwise dominate the cost;
    the target's logits are taken over the same clipped context, so the training signal stays
    self-consistent. Returns the token ids and the start position."""
    ids, start = sample.token_ids, sample.prompt_len - 1
    if max_context is not None and len(ids) > max_context:
        cut = min(len(ids) - max_context, start)
        ids, start = ids[cut:], start - cut
    return ids, start


def length_batches(items: Sequence[Prepared], batch_tokens: int) -> Iterator[list[int]]:
    """Indices of items in batches of similar length, each at most batch_tokens padded tokens
    (a single longer item makes its own batch)."""
    order = sorted(range(len(items)), key=lambda i: len(items[i].token_ids))
    batch: list[int] = []
    for i in order:
        longest = len(items[i].token_ids)
        if batch and (len(batch) + 1) * longest > batch_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def prepare(target: LlamaModel, samples: Sequence[Sample], max_context: int | None,
            with_hidden: bool, batch_tokens: int = 8192) -> list[Prepared]:
    items = [Prepared(s.kind, *clip(s, max_context)) for s in samples]
    if with_hidden:
        with torch.no_grad():
            for idx in length_batches(items, batch_tokens):
                batch = [items[i] for i in idx]
                hidden = dense_hidden(target, pad_batch([it.token_ids for it in batch]))
                for row, it in enumerate(batch):
                    it.target_hidden = hidden[row, it.start:len(it.token_ids) - 1].clone()
    return items


@dataclass(frozen=True, slots=True)
class Predictor:
    """A greedy draft in two halves, so the (large) head runs only at the reply positions."""

    hidden: Callable[[torch.Tensor], torch.Tensor]  # [B, T] ids -> [B, T, hidden]
    argmax: Callable[[torch.Tensor], torch.Tensor]  # [n, hidden] -> [n] full-vocabulary ids


def agreement_counts(pred: torch.Tensor, labels: torch.Tensor, skip_first: bool = True
                     ) -> tuple[int, int]:
    """(positions where a reply's prediction is the target's token, positions). The reply's
    first token is left out unless skip_first is False: the target's prefill emits it, and no
    draft ever guesses it when serving."""
    if skip_first:
        pred, labels = pred[1:], labels[1:]
    return int((pred == labels).sum()), len(labels)


def reply_rows(x: torch.Tensor, items: Sequence[Prepared]) -> torch.Tensor:
    """Rows of x ([B, T, ...], one item per row) at each item's reply positions, concatenated."""
    return torch.cat([x[r, it.start:len(it.token_ids) - 1] for r, it in enumerate(items)])


def predict_rows(predict: Predictor, items: Sequence[Prepared],
                 batch_tokens: int = 8192) -> Iterator[tuple[Prepared, torch.Tensor]]:
    """Yield each item with the predictor's tokens at its reply positions."""
    with torch.no_grad():
        for idx in length_batches(items, batch_tokens):
            batch = [items[i] for i in idx]
            hidden = predict.hidden(pad_batch([it.token_ids for it in batch]))
            pred = predict.argmax(reply_rows(hidden, batch))
            yield from zip(batch, pred.split([it.num_positions for it in batch]), strict=True)
