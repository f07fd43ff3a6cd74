"""Incremental detokenization, for stop strings and streaming.

Decoding a single token alone is wrong for byte-level BPE (a character can span tokens) and for
tokenizers that add a leading space; so we decode a short window before the new tokens and emit
only the text that grew past it, holding back an incomplete UTF-8 character ("\ufffd").
"""

from __future__ import annotations

from specserve.engine.request import Request

# How many tokens of left context to re-decode with each new token.
_PREFIX_WINDOW = 5


def detokenize_incrementally(tokenizer, req: Request) -> str:
    """Append the newly decodable text of req's output to req.output_text; return the delta."""
    ids = req.output_token_ids
    skip = req.params.skip_special_tokens
    prefix_text = tokenizer.decode(ids[req.prefix_offset:req.read_offset],
                                   skip_special_tokens=skip)
    new_text = tokenizer.decode(ids[req.prefix_offset:], skip_special_tokens=skip)
    if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
        return ""
    delta = new_text[len(prefix_text):]
    req.prefix_offset = max(req.read_offset - _PREFIX_WINDOW, 0)
    req.read_offset = len(ids)
    req.output_text += delta
    return delta


def find_stop_string(req: Request, delta_len: int) -> int | None:
    """If a stop string appeared in the text added last, return where the output must end."""
    text = req.output_text
    for stop in req.params.stop:
        # Only the new text (and the stop string's length before it) can hold a new match.
        start = max(len(text) - delta_len - len(stop) + 1, 0)
        idx = text.find(stop, start)
        if idx != -1:
            req.stop_reason = stop
            return idx + len(stop) if req.params.include_stop_str_in_output else idx
    return None
