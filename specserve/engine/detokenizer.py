"""Incremental detokenization, for stop strings and streaming; a token's raw bytes.

Decoding a single token alone is wrong for byte-level BPE (a character can span tokens) and for
tokenizers that add a leading space. A fast (Rust) tokenizer has this solved in
`tokenizers.decoders.DecodeStream`, which vLLM uses too: one call per token, ~0.5 µs, against
~5 µs for two `decode` calls through transformers (a server streams every token, so this runs
a thousand times a second on the engine thread). Other tokenizers decode a short window
before the new tokens and emit only the text that grew past it, holding back an incomplete
UTF-8 character ("\ufffd").

The text is what the model generated: transformers' `clean_up_tokenization_spaces` (on in Meta's
Llama 3 tokenizers) is never applied. It deletes the space before punctuation, so "x != y" would
read "x!= y", a structured output could stop matching its grammar and a stop string " ." could
never match; vLLM and SGLang leave it off too.
"""

from __future__ import annotations

import functools
import logging
import re

from tokenizers.decoders import ByteLevel, DecodeStream
from transformers.convert_slow_tokenizer import bytes_to_unicode

from specserve.engine.request import Request

# How many tokens of left context to re-decode with each new token (window fallback).
_PREFIX_WINDOW = 5
logger = logging.getLogger("specserve")

# Prompt tokens the output is decoded after (prompt_context).
MIN_CONTEXT, MAX_CONTEXT = 4, 24
# SentencePiece's byte fallback writes a byte it has no piece for as <0xNN>.
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_bytes(tokenizer, token_id: int) -> bytes:
    """The raw bytes a token stands for (OpenAI's logprob `bytes`). A token that holds part of a
    UTF-8 character decodes to U+FFFD on its own, so the bytes come from its vocabulary entry:
    byte-level BPE spells each byte as one character (GPT-2's table), SentencePiece spells a
    byte it fell back to as <0xNN> and a space as "\u2581" (decoded alone, a token's leading
    space is dropped, and OpenAI's bytes and text offsets would lose a space per word). Anything
    else: the decoded text's bytes."""
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if piece:
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        table = _byte_level_table()
        if isinstance(decoder, ByteLevel) and all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        if match := _BYTE_PIECE.fullmatch(piece):
            return bytes([int(match[1], 16)])
        if "\u2581" in piece:  # SentencePiece's word boundary, a space the decoder would drop
            return piece.replace("\u2581", " ").encode()
    return decode(tokenizer, [token_id]).encode()


def decode(tokenizer, ids: list[int], skip_special_tokens: bool = False) -> str:
    """The text of ids as generated (no clean-up of spaces, see above)."""
    return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens,
                            clean_up_tokenization_spaces=False)


@functools.cache
def _byte_level_table() -> dict[str, int]:
    return {char: byte for byte, char in bytes_to_unicode().items()}


def detokenize_incrementally(tokenizer, req: Request) -> str:
    """Append the newly decodable text of req's output to req.output_text; return the delta."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return _detokenize_window(tokenizer, req)
    if req.decode_stream is None:
        req.decode_stream = DecodeStream(skip_special_tokens=req.params.skip_special_tokens)
        for t in prompt_context(tokenizer, req.prompt_token_ids):  # primed, text dropped
            _step(backend, req, t)
    ids = req.output_token_ids
    pieces = [_step(backend, req, t) for t in ids[req.read_offset:]]
    req.read_offset = len(ids)
    delta = "".join(p for p in pieces if p)
    req.output_text += delta
    return delta


def _step(backend, req: Request, token: int) -> str | None:
    """One token through req's stream. tokenizers may refuse a step ("Invalid prefix
    encountered" when the text so far decodes differently once extended, vLLM #17448; an id
    past the tokenizer's vocabulary): the stream restarts at that token, and failing again,
    the token's text is dropped with a warning. An exception here would fail the engine step,
    and with it every running request."""
    for attempt in range(2):
        try:
            return req.decode_stream.step(backend, token)
        except Exception as exc:  # noqa: BLE001 (tokenizers raises plain Exception)
            if attempt:
                logger.warning("request %s: token %d has no text (%s)", req.request_id, token,
                               exc)
                return None
            req.decode_stream = DecodeStream(skip_special_tokens=req.params.skip_special_tokens)
    return None


def prompt_context(tokenizer, prompt_ids: list[int]) -> list[int]:
    """The prompt's last few tokens, that the output is decoded after: a SentencePiece
    tokenizer (Llama 2, Mistral) drops the leading space of the first token it decodes, so
    " Paris" after "The capital of France is" would come out as "Paris" (vLLM primes its
    stream the same way). At least MIN_CONTEXT tokens, more while their text starts inside a
    character (up to MAX_CONTEXT)."""
    for n in range(MIN_CONTEXT, MAX_CONTEXT + 1):
        tail = prompt_ids[-n:]
        if len(tail) < n or "\ufffd" not in decode(tokenizer, tail):
            return tail
    return prompt_ids[-MIN_CONTEXT:]


def decode_output(tokenizer, req: Request, ids: list[int]) -> str:
    """The text of output ids as they read after the prompt (see prompt_context)."""
    return decode_after(tokenizer, req.prompt_token_ids, ids, req.params.skip_special_tokens)


def decode_after(tokenizer, prompt_ids: list[int], ids: list[int], skip: bool) -> str:
    """The text of ids as they read after prompt_ids."""
    context = prompt_context(tokenizer, prompt_ids)
    head = decode(tokenizer, context, skip)
    text = decode(tokenizer, context + ids, skip)
    return text[len(head):] if text.startswith(head) else decode(tokenizer, ids, skip)


def _detokenize_window(tokenizer, req: Request) -> str:
    # The window runs over the prompt's last tokens and the output (offsets into both), so that
    # the first output token reads as it does after the prompt (prompt_context).
    if req.detok_context is None:
        req.detok_context = prompt_context(tokenizer, req.prompt_token_ids)
        req.prefix_offset, req.read_offset = 0, len(req.detok_context)
    context, out = req.detok_context, req.output_token_ids
    start = req.prefix_offset
    ids = context[start:] + out if start < len(context) else out[start - len(context):]
    skip = req.params.skip_special_tokens
    prefix_text = decode(tokenizer, ids[:req.read_offset - start], skip)
    new_text = decode(tokenizer, ids, skip)
    if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
        return ""
    delta = new_text[len(prefix_text):]
    req.prefix_offset = max(req.read_offset - _PREFIX_WINDOW, 0)
    req.read_offset = len(context) + len(out)
    req.output_text += delta
    return delta


def find_stop_string(req: Request, delta_len: int) -> int | None:
    """If a stop string appeared in the text added last, return where the output must end:
    at the match that begins first (several strings may match in one step's text, such as
    "." and "\n\n" in ".\n\n"; the list's order decides only between matches at one place)."""
    text = req.output_text
    best: tuple[int, str] | None = None
    for stop in req.params.stop:
        # Only the new text (and the stop string's length before it) can hold a new match.
        start = max(len(text) - delta_len - len(stop) + 1, 0)
        idx = text.find(stop, start)
        if idx != -1 and (best is None or idx < best[0]):
            best = (idx, stop)
    if best is None:
        return None
    idx, req.stop_reason = best
    return idx + len(req.stop_reason) if req.params.include_stop_str_in_output else idx
