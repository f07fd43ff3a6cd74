"""Incremental detokenization: the streamed pieces add up to what `decode` gives for the whole
output, for the fast path (tokenizers' DecodeStream) and the window fallback alike."""

from __future__ import annotations

import pytest

from specserve import SamplingParams
from specserve.engine.detokenizer import _detokenize_window, detokenize_incrementally
from specserve.engine.request import Request, RequestStatus

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


def _sentencepiece_like():
    """A word-level tokenizer with SentencePiece's Metaspace decoder (Llama 2, Mistral): the
    first token it decodes loses its leading space."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "▁The": 1, "▁capital": 2, "▁is": 3, "▁Paris": 4, ".": 5}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


@pytest.mark.parametrize("stream", [True, False])
def test_the_first_output_token_keeps_its_leading_space_after_the_prompt(stream):
    """"The capital is" + "▁Paris ." reads " Paris." after the prompt, as vLLM streams it; on its
    own the first token lost its space ("Paris.")."""
    from specserve.engine.output_processor import make_output

    tokenizer = _sentencepiece_like()
    assert tokenizer.decode([4, 5]) == "Paris."  # what decoding the output alone gives
    req = Request("r", [1, 2, 3], SamplingParams(max_tokens=2))
    req.stream = stream
    for t in (4, 5):
        req.output_token_ids.append(t)
        if stream:
            detokenize_incrementally(tokenizer, req)
    req.status = RequestStatus.FINISHED_LENGTH
    assert make_output(req, tokenizer, 1).outputs[0].text == " Paris."


def test_the_window_fallback_reads_the_first_token_after_the_prompt_too():
    """Tokenizers that clean up spaces (or have no fast backend) stream through a window of
    decodes, which now starts in the prompt's last tokens as the fast path does."""
    deltas, req = _stream(_sentencepiece_like(), [4, 5], _detokenize_window, True)
    assert req.output_text == "".join(deltas) == " Paris."


def test_a_step_the_tokenizer_refuses_costs_a_token_not_the_engine(monkeypatch):
    """tokenizers' DecodeStream may refuse a step ("Invalid prefix encountered", vLLM
    #17448): that used to fail the engine step, and every running request with it. The
    stream restarts at that token instead."""
    from tokenizers.decoders import DecodeStream

    from specserve.engine import detokenizer

    class Refusing:  # refuses "." after other tokens, as a stream with history may
        def __init__(self, *args, **kwargs):
            self.stream, self.steps = DecodeStream(*args, **kwargs), 0

        def step(self, backend, token):
            if token == 5 and self.steps:
                raise Exception("Invalid prefix encountered")
            self.steps += 1
            return self.stream.step(backend, token)

    monkeypatch.setattr(detokenizer, "DecodeStream", Refusing)
    deltas, req = _stream(_sentencepiece_like(), [4, 5, 3], detokenize_incrementally, True)
    assert req.output_text == "".join(deltas) and req.output_text == " Paris. is"


def test_a_sentencepiece_tokens_bytes_keep_its_leading_space():
    """OpenAI's logprob bytes (and the completions text_offset built from them) must add up to
    the text: decoded alone, "\u2581Paris" lost its space."""
    from specserve.engine.detokenizer import token_bytes

    tokenizer = _sentencepiece_like()
    assert token_bytes(tokenizer, 4) == b" Paris" and token_bytes(tokenizer, 5) == b"."


@pytest.mark.parametrize("detok", [detokenize_incrementally, _detokenize_window])
def test_spaces_before_punctuation_survive_a_tokenizer_that_cleans_them_up(llm, detok):
    """Meta's Llama 3 tokenizers set clean_up_tokenization_spaces, under which transformers 4
    (which pyproject allows) decodes "x != y" as "x!= y": the output text is what the model
    generated, as in vLLM (the fast path was skipped for such tokenizers and the fallback
    decoded with it on). transformers 5 skips the clean-up for BPE unless forced, as here."""
    import copy

    tokenizer = copy.deepcopy(llm.get_tokenizer())
    tokenizer.clean_up_tokenization_spaces = True
    tokenizer.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = True
    text = "if x != y and z == 'a' : print ( x ) . Done , ok ?"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) != text  # the premise: decode cleans up here
    deltas, req = _stream(tokenizer, ids, detok, True)
    assert "".join(deltas) == req.output_text == text


@pytest.mark.parametrize("include", [False, True])
def test_the_stop_string_that_begins_first_ends_the_text(include):
    """Two stop strings in one step's text: the earlier match ends it, whatever the list's
    order ("\\n\\n" listed first used to win over the "." before it)."""
    from specserve.engine.detokenizer import find_stop_string

    req = Request("r", [1, 2], SamplingParams(stop=["\n\n", "."],
                                              include_stop_str_in_output=include))
    req.output_text = "The end.\n\nMore"
    end = find_stop_string(req, len(".\n\nMore"))
    assert req.stop_reason == "." and req.output_text[:end] == ("The end." if include
                                                               else "The end")
