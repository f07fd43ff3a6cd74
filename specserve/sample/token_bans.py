"""vLLM's allowed_token_ids and bad_words: tokens a request may not emit.

- allowed_token_ids: every other token is out.
- bad_words: a word's last token is out wherever the tokens before it have just been output
  (a one-token word: everywhere). Each word is encoded as it starts a text and after a space,
  as vLLM encodes it.

Set to -inf in place in the logits that greedy decoding, random sampling and the rejection
sampler all read, before the penalties. Row j of a request verifying K drafts is banned as if
drafts 0..j-1 were already output, so verification samples what plain decoding would. A ban
that would leave a row nothing to sample (bad words against the allowed tokens, or the allowed
tokens against a grammar's mask) is dropped for that row: the request still gets a token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from specserve.engine.request import Request


def bad_words_token_ids(tokenizer, words: list[str]) -> list[tuple[int, ...]]:
    """Each word's token ids, as it starts a text and after a space (distinct ones)."""
    encoded: dict[tuple[int, ...], None] = {}
    for word in words:
        for text in (word.lstrip(), " " + word.lstrip()):
            if ids := tuple(tokenizer.encode(text, add_special_tokens=False)):
                encoded[ids] = None
    return list(encoded)


def apply_token_bans(logits: torch.Tensor, sampling: list[tuple[Request, int]]) -> None:
    """sampling: (request, K) in row order, K + 1 rows each. Only requests with bans pay."""
    row = 0
    with torch.inference_mode():  # the runner made logits under it
        for req, k in sampling:
            allowed, words = req.params.allowed_token_ids, req.bad_words_token_ids
            if allowed or words:
                rows = logits[row:row + k + 1]  # a view
                before = rows.clone()
                if allowed:
                    if req.allowed_ids is None:
                        req.allowed_ids = torch.tensor(sorted(set(allowed)), dtype=torch.long)
                    kept = rows[:, req.allowed_ids]
                    rows.fill_(float("-inf"))
                    rows[:, req.allowed_ids] = kept
                if words:
                    output = req.output_token_ids + req.spec_token_ids[:k]
                    n = len(req.output_token_ids)
                    for j in range(k + 1):
                        banned = _banned(words, output[:n + j])
                        if banned:
                            rows[j, banned] = float("-inf")
                empty = ~torch.isfinite(rows).any(-1)
                if empty.any():
                    rows[empty] = before[empty]
            row += k + 1


def _banned(words: list[tuple[int, ...]], output: list[int]) -> list[int]:
    """The last tokens of the words whose other tokens end the output."""
    return [w[-1] for w in words
            if len(w) - 1 <= len(output) and tuple(output[len(output) - len(w) + 1:]) == w[:-1]]
