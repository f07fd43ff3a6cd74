"""Incremental detokenization: the streamed pieces add up to what `decode` gives for the whole
output, for the fast path (tokenizers' DecodeStream) and the window fallback alike."""

from __future__ import annotations

import pytest

from specserve import SamplingParams
from specserve.engine.detokenizer import _detokenize_window, detokenize_incrementally
from specserve.engine.request import Request

# Characters that span several byte-level tokens, a special token, spaces before punctuation.
TEXT = "Crème brûlée costs 5 € — 🍮🍮! Hello , world .<|im_end|> 日本語のテキスト"


def _stream(tokenizer, ids: list[int], detok, skip: bool) -> tuple[list[str], Request]:
    req = Request("r", [1, 2], SamplingParams(skip_special_tokens=skip))
    deltas = []
    for t in ids:
        req.output_token_ids.append(t)
        deltas.append(detok(tokenizer, req))
    return deltas, req


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("detok", [detokenize_incrementally, _detokenize_window])
def test_stream_adds_up_to_decode(llm, detok, skip):
    tokenizer = llm.get_tokenizer()
    ids = tokenizer(TEXT, add_special_tokens=False).input_ids
    assert len(ids) > len(TEXT.split())  # multi-token characters are in there
    deltas, req = _stream(tokenizer, ids, detok, skip)
    expected = tokenizer.decode(ids, skip_special_tokens=skip)
    assert "".join(deltas) == req.output_text == expected
    # An incomplete character is held back, never emitted as a replacement character.
    assert not any("\ufffd" in d for d in deltas)
    assert ("<|im_end|>" in expected) != skip


def test_fast_path_is_used_for_a_fast_tokenizer(llm):
    tokenizer = llm.get_tokenizer()
    _, req = _stream(tokenizer, tokenizer("Hi there", add_special_tokens=False).input_ids,
                     detokenize_incrementally, True)
    assert req.decode_stream is not None
