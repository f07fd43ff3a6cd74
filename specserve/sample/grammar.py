"""Structured outputs: constrain a request's tokens to a JSON schema, a regex, a list of choices or
an EBNF grammar, with xgrammar (as vLLM and SGLang do).

Each constrained request carries a grammar matcher that has accepted its output so far. Before
sampling, every row a request samples from gets the matcher's token bitmask: disallowed tokens
go to -inf in the logits that greedy decoding, random sampling and the rejection sampler all
read. A request verifying K draft tokens has K + 1 rows: row j is masked for the state after
drafts 0..j-1, found by advancing the matcher through them and rolling it back afterwards. A
draft token the grammar forbids has probability 0 under its row, so it is rejected, and the rows
after it are never read. The verification stays lossless against constrained decoding.

Where the grammar leaves only one way to go (a JSON schema's keys and punctuation), the forced
text is proposed as draft tokens ("jump-forward" as SGLang named it) and verified like any draft:
the model, not the grammar, still picks the tokenization, so the output is what constrained
decoding without drafts gives.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import sys
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from specserve.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    from specserve.engine.request import Request

logger = logging.getLogger(__name__)

# Compiled grammars are cached by spec (a repeated schema compiles once); bounded, because a
# server may see any number of distinct schemas.
GRAMMAR_CACHE_BYTES = 64 * 2**20
_CPP_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


# Characters of a forced string read per jump-forward draft token at most (the rest is past
# the drafts a step verifies).
_CHARS_PER_DRAFT = 32


class GrammarBackend:
    """One per engine: the tokenizer's vocabulary as xgrammar sees it and a compiler whose
    cache makes a repeated schema free. xgrammar is imported on the first constrained request,
    so an engine that never sees one never loads it. `compile` may run on any thread (the
    server compiles off the engine thread, so a slow schema never stalls a step)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...]):
        import xgrammar as xgr

        self._xgr = xgr
        # None for a model without EOS (xgrammar refuses an empty list): requests then end
        # on their own stop_token_ids (matcher).
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=list(eos_token_ids) or None)
        self._compiler = xgr.GrammarCompiler(info, max_threads=2,
                                             cache_limit_bytes=GRAMMAR_CACHE_BYTES)
        self._eos = list(eos_token_ids)
        self._tokenizer = tokenizer
        self._token_bytes = info.decoded_vocab  # each token's bytes, as the grammar reads them
        # A schema's forced runs (`", "name": "`) recur in every request that uses it: each is
        # encoded once, not at every step of every request.
        self._encode = functools.lru_cache(maxsize=1 << 12)(self._encode_run)
        self.vocab_size = vocab_size
        # Per token that ended a forced run: [times the model wrote it there, times observed].
        self._tails: dict[int, list[int]] = {}

    def compile(self, spec: StructuredOutputsParams):
        """The compiled grammar (cached). Raises ValueError for a schema, regex or grammar
        that does not compile."""
        c = self._compiler
        try:
            if spec.json is not None:
                schema = spec.json if isinstance(spec.json, str) else json.dumps(spec.json)
                return c.compile_json_schema(schema,
                                             any_whitespace=not spec.disable_any_whitespace)
            if spec.json_object:
                # Any JSON *object*: xgrammar's built-in JSON grammar admits arrays too.
                return c.compile_json_schema('{"type": "object"}',
                                             any_whitespace=not spec.disable_any_whitespace)
            if spec.regex is not None:
                return c.compile_regex(spec.regex)
            if spec.choice is not None:
                # ensure_ascii=False: EBNF string literals take the characters themselves.
                alternatives = " | ".join(json.dumps(s, ensure_ascii=False)
                                          for s in spec.choice)
                return c.compile_grammar(f"root ::= {alternatives}")
            return c.compile_grammar(spec.grammar)
        except Exception as exc:  # xgrammar raises RuntimeError and its own types
            # Its C++ messages start with "[time] file.cc:line: ", which says nothing to a user.
            message = _CPP_LOG_PREFIX.sub("", str(exc).strip())
            raise ValueError(f"structured_outputs {spec.kind} does not compile: "
                             f"{message}") from exc

    def matcher(self, spec: StructuredOutputsParams, stop_token_ids: set[int],
                compiled: Any = None):
        """A fresh matcher for one request (over `compiled`, compile(spec)'s result, if the
        caller has it). A completed grammar lets the model's EOS and the request's own stop
        ids end the output."""
        stops = sorted(set(self._eos) | stop_token_ids)
        if not stops:
            raise ValueError("structured_outputs needs a stop token to end the output: the "
                             "model has no EOS and the request no stop_token_ids")
        return self._xgr.GrammarMatcher(compiled if compiled is not None else self.compile(spec),
                                        override_stop_tokens=stops)

    def forced_tokens(self, req: Request, limit: int) -> list[int]:
        """Up to `limit` draft tokens for the text req's grammar forces next (none if it forces
        nothing). The text is encoded with the model's own tokenizer: xgrammar's tokens for
        it (longest match) split words differently from BPE, and the model writes BPE (on the
        json workload's schemas they were accepted 89% of the time against 95%). Where the
        tokenizer's tokens do not spell the text exactly, xgrammar's are drafted instead.

        The last token of a forced run is the doubtful one: the free text after it may merge
        into it (the run `"name"` ends in `"`, and the model writes `":`; `: [` where it writes
        ` ["`). So the tail is kept only while the model has written that token at the end of
        a run at least half the time, and it is observed either way: drafted, or held back and
        compared with the token the model then wrote there. With any whitespace allowed, where
        a run ends before the free whitespace, drafting every tail had 31% of the drafts
        rejected."""
        req.jump_forward_tail = None
        text = req.grammar.find_jump_forward_string()
        if not text:
            return []
        cut = text[:_CHARS_PER_DRAFT * (limit + 2)]
        if len(cut) < len(text):
            # A long forced string (a schema's 50 KB const) would be encoded whole at every
            # step, and every shorter version cached. Its first `limit` tokens come from its
            # head, when they end well before the cut (the word the cut falls in may split
            # differently); otherwise this step drafts none of it.
            head = self._encode(cut)
            if head is not None and len(head) > limit:
                used = sum(len(self._token_bytes[t]) for t in head[:limit])
                if used + _CHARS_PER_DRAFT <= len(cut.encode()):
                    return list(head[:limit])  # the run goes on: no tail among the drafts
            return []
        run = self._encode(text)
        if run is None:  # the tokenizer's tokens do not spell the run: xgrammar's do
            run = tuple(req.grammar.find_jump_forward_tokens())
            if not run:
                return []
        if len(run) > limit:
            return list(run[:limit])  # the run goes on: its last draft is not its tail
        tail = run[-1]
        req.jump_forward_tail = (tail, len(run) - 1)
        hits, seen = self._tails.get(tail, (0, 0))
        keep = 2 * (hits + 1) >= seen + 2  # Laplace's estimate of the rate >= 1/2
        return list(run if keep else run[:-1])

    def _encode_run(self, text: str) -> tuple[int, ...] | None:
        """The model tokenizer's tokens for a forced run, or None where they do not spell
        exactly its bytes: a SentencePiece tokenizer (Llama 2's) puts a space before the first
        word of any text it encodes, and every such draft would be rejected."""
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        try:
            spelled = b"".join(self._token_bytes[t] for t in ids)
        except IndexError:  # an id beyond the model's vocabulary (added tokens)
            return None
        return tuple(ids) if spelled == text.encode() else None

    def observe_tail(self, req: Request, tokens: list[int]) -> None:
        """req emitted `tokens` after a step that drafted (part of) a forced run: if the model
        got as far as the run's tail, learn whether it wrote that token there."""
        tail, position = req.jump_forward_tail
        req.jump_forward_tail = None
        if len(tokens) > position:
            counts = self._tails.setdefault(tail, [0, 0])
            counts[0] += tokens[position] == tail
            counts[1] += 1

    def mask(self, logits: torch.Tensor, sampling: list[tuple[Request, int]]) -> None:
        """Mask, in place, every row a constrained request samples from this step. sampling:
        (request, K) in row order, K + 1 rows each."""
        constrained = []  # (request, K, its first row, its first constrained row)
        for (req, k), row in zip(sampling, _row_starts(sampling), strict=True):
            if req.grammar is None or req.grammar.is_terminated():
                continue
            start = 0
            if req.grammar_after is not None:  # rows up to the end of reasoning are free
                start, _ = self._after_end(req, req.spec_token_ids[:k])
                if start is None:
                    continue
            constrained.append((req, k, row, start))
        if not constrained:  # every matcher terminated (EOS under ignore_eos) or waiting
            return
        bitmask = self._xgr.allocate_token_bitmask(
            sum(k + 1 - start for _, k, _, start in constrained), self.vocab_size)
        rows: list[int] = []  # logits row of each filled bitmask row
        for req, k, row, start in constrained:
            matcher = req.grammar
            matcher.fill_next_token_bitmask(bitmask, len(rows))
            rows.append(row + start)
            advanced = 0
            try:
                for j, token in enumerate(req.spec_token_ids[start:k], start):
                    if not matcher.accept_token(token):
                        break  # draft j is rejected: rows after it are never read
                    advanced += 1
                    if matcher.is_terminated():
                        break  # draft j was a stop token: the output ends there
                    matcher.fill_next_token_bitmask(bitmask, len(rows))
                    rows.append(row + j + 1)
            finally:
                if advanced:
                    matcher.rollback(advanced)
        _apply_bitmask(logits, bitmask[:len(rows)], rows, self.vocab_size)

    def _after_end(self, req: Request, tokens: list[int]) -> tuple[int | None, bytes]:
        """How many of `tokens` (emitted after the output so far) end the reasoning of a
        request whose grammar waits for it: the grammar constrains the token after them (None
        if the reasoning goes on past them); and the output's last bytes that may begin the
        end, after them. The end is found in bytes (a model may split `</think>` into other
        tokens than its encoding); a token that completes it ends the reasoning whole, and the
        rest of that token's text is not constrained."""
        end, seen = req.grammar_after, req.grammar_tail
        keep = len(end) - 1
        for i, token in enumerate(tokens):
            seen += self._token_bytes[token] if token < len(self._token_bytes) else b""
            if end in seen:
                return i + 1, b""
            seen = seen[len(seen) - keep:] if len(seen) > keep else seen
        return None, seen

    def accept_emitted(self, req: Request, tokens: list[int]) -> None:
        """Advance a constrained request's matcher over the tokens it emitted this step (those
        after its reasoning, for one that waits for it)."""
        if req.grammar_after is not None:
            start, req.grammar_tail = self._after_end(req, tokens)
            if start is None:  # still reasoning
                return
            req.grammar_after, tokens = None, tokens[start:]
        _accept(req, tokens)


def _row_starts(sampling: list[tuple[Request, int]]) -> list[int]:
    starts, row = [], 0
    for _, k in sampling:
        starts.append(row)
        row += k + 1
    return starts


def _apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int],
                   vocab_size: int) -> None:
    """Set the logits of forbidden tokens (bit 0: token 32 w + b is bit b of word w) of the
    given rows to -inf; bitmask row i is for logits row rows[i]. numpy's unpackbits does this
    5x faster than xgrammar's CPU kernel (1.4 ms against 7 ms for 32 rows of 49152), which
    was most of a step's grammar cost. Logits reach the sampler on the host on every device
    (the runner copies the few rows it samples from), so there is no device path."""
    assert sys.byteorder == "little"  # the uint8 view below reads the int32 words' bytes
    forbidden = np.unpackbits(~bitmask.numpy().view(np.uint8), axis=-1,
                              bitorder="little")[:, :vocab_size].view(np.bool_)
    forbidden = torch.from_numpy(forbidden)
    with torch.inference_mode():  # the runner made logits under it
        if rows == list(range(rows[0], rows[0] + len(rows))):  # a block: fill in place
            logits[rows[0]:rows[0] + len(rows), :vocab_size].masked_fill_(forbidden,
                                                                         float("-inf"))
        else:
            index = torch.tensor(rows, dtype=torch.long)
            logits[index, :vocab_size] = logits[index, :vocab_size].masked_fill(
                forbidden, float("-inf"))


def _accept(req: Request, tokens: list[int]) -> None:
    """Advance a constrained request's matcher over tokens it emitted."""
    matcher = req.grammar
    for token in tokens:
        if matcher.is_terminated():
            return  # EOS was emitted under ignore_eos: the rest is unconstrained
        if not matcher.accept_token(token):
            # Cannot happen while the masks hold; if it does, say so rather than drift.
            logger.warning("request %s emitted token %d that its grammar refuses; the rest "
                           "of its output is unconstrained", req.request_id, token)
            req.grammar = None
            return
