"""vLLM's allowed_token_ids and bad_words: tokens a request may not emit.

- allowed_token_ids: every other token is out.
- bad_words: a word's last token is out wherever the tokens before it have just been output
  (a one-token word: everywhere). Each word is encoded as vLLM encodes it: as it starts a text,
  and after a space when that makes a different word token.

Set to -inf in place in the logits that greedy decoding, random sampling and the rejection
sampler all read, before the penalties. Row j of a request verifying K drafts is banned as if
drafts 0..j-1 were already output, so verification samples what plain decoding would. A ban
never leaves a row nothing to sample: bad words that would are dropped for that row (the
allowed tokens stay), and so are the allowed tokens where a grammar's mask or min_tokens'
already excludes them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from specserve.engine.request import Request


def bad_words_token_ids(tokenizer, words: list[str], vocab: int) -> list[tuple[int, ...]]:
    """Each word's token ids: as it starts a text, and after a space if that encodes to as
    many tokens starting with another one (vLLM's rule). Raises ValueError for a word the
    model cannot write (a token past its vocabulary)."""
    encoded: dict[tuple[int, ...], None] = {}
    for word in words:
        plain = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        for ids in (plain, spaced) if (spaced and plain and spaced[0] != plain[0]
                                       and len(spaced) == len(plain)) else (plain,):
            if any(t >= vocab for t in ids):
                raise ValueError(f"bad_words: {word!r} encodes to token ids past the model's "
                                 f"vocabulary ({vocab})")
            if ids:
                encoded[ids] = None
    return list(encoded)


class BadWords:
    """A request's bad words, indexed for a step: by how many tokens precede the last one,
    the preceding tokens and the last tokens they ban."""

    def __init__(self, words: list[tuple[int, ...]]):
        self.by_prefix: dict[int, dict[tuple[int, ...], list[int]]] = {}
        for w in words:
            self.by_prefix.setdefault(len(w) - 1, {}).setdefault(w[:-1], []).append(w[-1])
        self.longest_prefix = max(self.by_prefix, default=0)

    def banned(self, output: list[int]) -> list[int]:
        """The tokens that may not follow `output` (its end is enough)."""
        out: list[int] = []
        for n, prefixes in self.by_prefix.items():
            if n <= len(output):
                out += prefixes.get(tuple(output[len(output) - n:]), ())
        return out


def apply_token_bans(logits: torch.Tensor, sampling: list[tuple[Request, int]]) -> None:
    """sampling: (request, K) in row order, K + 1 rows each. Only requests with bans pay."""
    row = 0
    with torch.inference_mode():  # the runner made logits under it
        for req, k in sampling:
            if req.params.allowed_token_ids or req.bad_words is not None:
                _ban(req, logits[row:row + k + 1], k)
            row += k + 1


def _ban(req: Request, rows: torch.Tensor, k: int) -> None:
    """One request's K + 1 rows (a view), in place."""
    allowed, live = None, None
    if req.params.allowed_token_ids:
        if req.allowed_ids is None:
            req.allowed_ids = torch.tensor(sorted(set(req.params.allowed_token_ids)),
                                           dtype=torch.long)
        allowed = req.allowed_ids
        kept = rows[:, allowed]
        live = torch.isfinite(kept).any(-1).tolist()  # rows a mask leaves some allowed token
        for j in range(k + 1):
            if live[j]:
                rows[j].fill_(float("-inf"))
                rows[j, allowed] = kept[j]
    words = req.bad_words
    if words is None:
        return
    # Only the output's end can start a word: the rows' histories from its last tokens.
    tail = req.output_token_ids[max(0, len(req.output_token_ids) - words.longest_prefix):]
    history = tail + req.spec_token_ids[:k]
    # Without a mask narrowing a row (allowed tokens, a grammar, min_tokens), a few banned
    # tokens cannot leave it empty: no need to look.
    narrowed = (allowed is not None or req.grammar is not None
                or req.params.min_tokens > req.num_output_tokens)
    for j in range(k + 1):
        banned = words.banned(history[:len(tail) + j])
        if not banned:
            continue
        saved = rows[j, banned]
        rows[j, banned] = float("-inf")
        if narrowed:
            left = rows[j, allowed] if allowed is not None and live[j] else rows[j]
            if not torch.isfinite(left).any():  # nothing left to sample: no bad words here
                rows[j, banned] = saved
