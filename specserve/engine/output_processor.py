"""Turning emitted tokens into request state and outputs: logprobs, stop checks, RequestOutput."""

from __future__ import annotations

from collections.abc import Callable

import torch

from specserve.engine.detokenizer import (
    decode_output,
    detokenize_incrementally,
    find_stop_string,
)
from specserve.engine.request import Request, RequestStatus
from specserve.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput


def logprob_entries(logits: torch.Tensor, tokens: list[int], num_top: int | None,
                    text: Callable[[int], str]) -> list[dict[int, Logprob]]:
    """Per row of logits [len(tokens), vocab]: {token: its Logprob} and the top num_top;
    text(token) is each one's decoded_token."""
    if not tokens:
        return []
    logprobs = logits.float().log_softmax(dim=-1)
    chosen = logprobs.gather(1, torch.tensor(tokens, device=logits.device).unsqueeze(1))
    # vLLM's rank: how many tokens are at least as likely as this one.
    ranks = (logprobs >= chosen).sum(dim=1).tolist()
    entries = [{t: Logprob(v, r, text(t))}
               for t, v, r in zip(tokens, chosen.squeeze(1).tolist(), ranks, strict=True)]
    if num_top:
        top = logprobs.topk(num_top)
        for entry, token, ids, values in zip(entries, tokens, top.indices.tolist(),
                                             top.values.tolist(), strict=True):
            # Under a grammar fewer tokens than asked for may be possible: no -inf entries.
            for rank, (t, v) in enumerate(zip(ids, values, strict=True), start=1):
                if v != float("-inf") and t != token:
                    entry[t] = Logprob(v, rank, text(t))
    return entries


def record_logprobs(req: Request, logits: torch.Tensor, tokens: list[int],
                    text: Callable[[int], str]) -> None:
    """logits: [len(tokens), vocab], the rows that produced `tokens`."""
    for entry, token in zip(logprob_entries(logits, tokens, req.params.logprobs, text), tokens,
                            strict=True):
        req.logprobs.append(entry)
        req.cumulative_logprob += entry[token]


def record_prompt_logprobs(req: Request, logits: torch.Tensor,
                           text: Callable[[int], str]) -> None:
    """logits: the rows of the prompt positions after the last one scored, in order; each
    scores the prompt token that follows its position."""
    start = len(req.prompt_logprobs)
    tokens = req.prompt_token_ids[start:start + len(logits)]
    req.prompt_logprobs.extend(logprob_entries(logits, tokens, req.params.prompt_logprobs,
                                               text))


def check_stop(req: Request, token: int, tokenizer, eos_token_ids: tuple[int, ...]
               ) -> RequestStatus | None:
    """After `token` was appended: the finished status if a stop condition is met."""
    if token in req.stop_token_ids and (req.num_output_tokens > req.params.min_tokens
                                        or _grammar_completed(req)):
        # An EOS stops as EOS (no reason, as vLLM); with ignore_eos a listed EOS id stopped
        # only because the request listed it, and is reported like any stop_token_ids entry.
        is_eos = token in eos_token_ids and not req.params.ignore_eos
        req.stop_reason = None if is_eos else token
        if req.stream and req.params.include_stop_str_in_output:
            detokenize_incrementally(tokenizer, req)
        return RequestStatus.FINISHED_STOPPED
    if req.stream:
        delta = detokenize_incrementally(tokenizer, req)
        # Nor does a stop string end it within its first min_tokens tokens: as a stop token,
        # it must come after them (vLLM V1's `len(output) > min_tokens`).
        if delta and req.params.stop and req.num_output_tokens > req.params.min_tokens:
            end = find_stop_string(req, len(delta))
            if end is not None:
                req.output_text = req.output_text[:end]
                return RequestStatus.FINISHED_STOPPED
    if req.num_output_tokens >= req.max_tokens:
        return RequestStatus.FINISHED_LENGTH
    return None


def _grammar_completed(req: Request) -> bool:
    """A structured output whose grammar accepted its stop token ends there, min_tokens or not
    (the grammar allowed nothing else)."""
    return req.grammar is not None and req.grammar.is_terminated()


def make_output(req: Request, tokenizer, num_new: int, itl: float | None = None
                ) -> RequestOutput:
    """The request's output so far; the full text is decoded once, at the end, unless the
    request streams (then it is kept incrementally). itl: seconds since the request's previous
    step that emitted tokens (None at its first token)."""
    finished = req.is_finished
    if req.stream:
        text = req.output_text
    elif finished:
        ids = req.output_token_ids
        # A stop token's text is not output unless asked for (vLLM's rule), as streamed: a
        # stop token id like "," or an EOS kept by skip_special_tokens=False ended the text
        # only when it was not streamed.
        if (req.finish_reason == "stop" and ids and ids[-1] in req.stop_token_ids
                and not req.params.include_stop_str_in_output):
            ids = ids[:-1]
        text = decode_output(tokenizer, req, ids)
    else:
        text = ""
    with_logprobs = req.params.logprobs is not None
    completion = CompletionOutput(
        index=0, text=text, token_ids=list(req.output_token_ids),
        cumulative_logprob=req.cumulative_logprob if with_logprobs else None,
        logprobs=list(req.logprobs) if with_logprobs else None,
        finish_reason=req.finish_reason, stop_reason=req.stop_reason)
    metrics = RequestMetrics(req.arrival_time, req.first_token_time, req.finished_time,
                             req.num_cached_tokens, req.num_preemptions,
                             req.num_draft_tokens, req.num_accepted_tokens, req.scheduled_time,
                             [] if itl is None else [itl], req.last_token_time)
    delta = req.output_token_ids[-num_new:] if num_new else []
    return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, [completion],
                         finished, metrics, delta_token_ids=delta,
                         prompt_logprobs=req.prompt_logprobs)
