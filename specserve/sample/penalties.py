"""Logit bias and repetition penalties, with vLLM's (and OpenAI's) definitions:

- logit_bias: a fixed value added to a token's logit (OpenAI: -100..100).
- presence_penalty / frequency_penalty: subtracted once / once per occurrence for every token
  in the output so far.
- repetition_penalty (transformers' definition, as vLLM applies it): a token seen in the prompt
  or the output has its logit divided by the penalty when positive, multiplied when negative.

Applied in place to the logits every sampler reads, before temperature and top-k / top-p, so
plain sampling, greedy decoding and the rejection sampler see one distribution. Row j of a
request verifying K drafts is penalised as if drafts 0..j-1 were already output: it is the
distribution plain decoding would sample from there, so verification stays lossless. Only
requests that ask for these pay anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from specserve.engine.request import Request
    from specserve.sampling_params import SamplingParams


def has_logit_processing(params: SamplingParams) -> bool:
    return bool(params.logit_bias) or params.presence_penalty != 0 \
        or params.frequency_penalty != 0 or params.repetition_penalty != 1


def apply_penalties(logits: torch.Tensor, sampling: list[tuple[Request, int]]) -> None:
    """sampling: (request, K) in row order, K + 1 rows each."""
    row, vocab = 0, logits.shape[-1]
    with torch.inference_mode():  # the runner made logits under it
        for req, k in sampling:
            p = req.params
            if has_logit_processing(p):
                rows = logits[row:row + k + 1]  # a view
                if p.logit_bias:
                    ids = torch.tensor(list(p.logit_bias), dtype=torch.long)
                    rows[:, ids] += torch.tensor(list(p.logit_bias.values()))
                if p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1:
                    _penalise(rows, req, req.spec_token_ids[:k], vocab)
            row += k + 1


def _penalise(rows: torch.Tensor, req: Request, drafts: list[int], vocab: int) -> None:
    p = req.params
    # counts[j]: occurrences of each token in the output before row j (drafts included).
    before = torch.tensor(req.output_token_ids + drafts, dtype=torch.long)
    counts = torch.zeros(len(drafts) + 1, vocab)
    n = len(req.output_token_ids)
    if n:
        counts[:, :] = torch.bincount(before[:n], minlength=vocab).to(counts.dtype)
    for j, token in enumerate(drafts):
        counts[j + 1:, token] += 1
    if p.repetition_penalty != 1:
        seen = counts > 0
        seen[:, torch.tensor(req.prompt_token_ids, dtype=torch.long)] = True
        penalised = torch.where(rows > 0, rows / p.repetition_penalty,
                                rows * p.repetition_penalty)
        rows.copy_(torch.where(seen, penalised, rows))
    if p.frequency_penalty:
        rows -= p.frequency_penalty * counts
    if p.presence_penalty:
        rows -= p.presence_penalty * (counts > 0).to(rows.dtype)
