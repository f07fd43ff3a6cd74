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
    """Whether a request changes its logits before sampling: here, or in token_bans.py."""
    return bool(params.logit_bias) or params.presence_penalty != 0 \
        or params.frequency_penalty != 0 or params.repetition_penalty != 1 \
        or bool(params.allowed_token_ids) or bool(params.bad_words)


def apply_penalties(logits: torch.Tensor, sampling: list[tuple[Request, int]]) -> None:
    """sampling: (request, K) in row order, K + 1 rows each. Sparse: only the logits of the
    biased tokens and of the tokens each row has seen are read and written, in a few batched
    ops for the whole step (a dense pass per request cost 18% of a step at 32 requests)."""
    vocab = logits.shape[-1]
    flat = logits.view(-1)  # key = row * vocab + token
    bias_keys, bias_vals, rep_keys, rep_vals, out_keys, freq_vals, pres_vals = ([] for _ in
                                                                                range(7))
    row = 0
    for req, k in sampling:
        if req.processes_logits:
            p = req.params
            starts = torch.arange(row, row + k + 1) * vocab
            if p.logit_bias:
                if req.logit_bias_tensors is None:  # made once: the bias never changes
                    req.logit_bias_tensors = (
                        torch.tensor(list(p.logit_bias), dtype=torch.long),
                        torch.tensor(list(p.logit_bias.values()), dtype=torch.float32))
                ids, values = req.logit_bias_tensors
                bias_keys.append((starts.unsqueeze(1) + ids).flatten())
                bias_vals.append(values.to(logits.dtype).repeat(k + 1))
            if p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1:
                # Row j has seen the output and drafts 0..j-1.
                drafts = req.spec_token_ids[:k]
                history = torch.tensor(req.output_token_ids + drafts, dtype=torch.long)
                n = len(req.output_token_ids)
                keys = torch.cat([starts[j] + history[:n + j] for j in range(k + 1)])
                if p.repetition_penalty != 1:
                    if req.unique_prompt_ids is None:
                        req.unique_prompt_ids = torch.tensor(
                            sorted(set(req.prompt_token_ids)), dtype=torch.long)
                    seen = torch.cat([keys, (starts.unsqueeze(1)
                                             + req.unique_prompt_ids).flatten()])
                    rep_keys.append(seen)
                    rep_vals.append(torch.full((len(seen),), float(p.repetition_penalty)))
                if p.presence_penalty or p.frequency_penalty:
                    out_keys.append(keys)
                    freq_vals.append(torch.full((len(keys),), float(p.frequency_penalty)))
                    pres_vals.append(torch.full((len(keys),), float(p.presence_penalty)))
        row += k + 1
    with torch.inference_mode():  # the runner made logits under it
        if bias_keys:  # a request's bias keys are distinct
            flat.index_add_(0, torch.cat(bias_keys), torch.cat(bias_vals))
        if rep_keys:
            keys, _, (penalty,) = _per_key(rep_keys, rep_vals)
            values = flat[keys]
            flat[keys] = torch.where(values > 0, values / penalty, values * penalty)
        if out_keys:
            keys, counts, (frequency, presence) = _per_key(out_keys, freq_vals, pres_vals)
            values = flat[keys]
            values -= frequency * counts
            values -= presence
            flat[keys] = values


def _per_key(keys: list[torch.Tensor], *values: list[torch.Tensor]
             ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Distinct keys, how often each occurred, and each value list's entry for it. A key holds
    its row, so all its occurrences belong to one request and carry the same values."""
    flat = torch.cat(keys)
    unique, inverse, counts = torch.unique(flat, return_inverse=True, return_counts=True)
    occurrence = torch.empty_like(unique).scatter_(0, inverse, torch.arange(len(flat)))
    return unique, counts, [torch.cat(v)[occurrence] for v in values]
