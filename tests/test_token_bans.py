"""allowed_token_ids and bad_words (vLLM's): every verification row is banned as plain decoding
would be there (so speculation stays lossless), a ban never leaves a row nothing to sample, words
are encoded as vLLM encodes them, and the engine keeps to both under greedy and random sampling.
Speculation under them is checked in test_penalties.py."""

from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS

from specserve import SamplingParams, StructuredOutputsParams
from specserve.engine.request import Request
from specserve.sample.token_bans import BadWords, apply_token_bans, bad_words_token_ids

VOCAB = 50
WORDS = [(7,), (4, 5), (5, 6, 8), (2, 2)]


def _reference_row(row: torch.Tensor, allowed: list[int] | None,
                   words: list[tuple[int, ...]], output: list[int]) -> torch.Tensor:
    """One row, from the definitions."""
    row = row.clone()
    if allowed is not None:
        out = torch.ones(VOCAB, dtype=torch.bool)
        out[allowed] = False
        row[out] = float("-inf")
    for w in words:
        if len(w) == 1 or output[-(len(w) - 1):] == list(w[:-1]):
            row[w[-1]] = float("-inf")
    return row


@pytest.mark.parametrize("allowed", [None, [2, 5, 6, 7, 8, 11, 30]])
def test_each_verification_row_is_banned_as_plain_decoding_would_be(allowed):
    """A free request, the request under test verifying 4 drafts (its output ends in 4, and
    its drafts complete words at some rows), a free one."""
    torch.manual_seed(0)
    output, drafts = [9, 2, 4], [5, 6, 2, 2]
    req = Request("r", [1, 2], SamplingParams(allowed_token_ids=allowed,
                                              bad_words=["x"]))  # words set as the engine does
    req.bad_words = BadWords(WORDS)
    req.output_token_ids, req.spec_token_ids = list(output), list(drafts)
    free = Request("free", [9], SamplingParams())
    logits = torch.randn(1 + len(drafts) + 1 + 1, VOCAB)
    want = logits.clone()
    apply_token_bans(logits, [(free, 0), (req, len(drafts)), (free, 0)])
    assert torch.equal(logits[0], want[0]) and torch.equal(logits[-1], want[-1])
    for j in range(len(drafts) + 1):
        expected = _reference_row(want[1 + j], allowed, WORDS, output + drafts[:j])
        assert torch.equal(logits[1 + j], expected), j
    banned_by_words = [torch.isneginf(logits[1 + j, [7, 5, 8, 2]]).tolist()
                       for j in range(len(drafts) + 1)]
    # after "4": 5 out; after "5 6": 8 out; after "2": 2 out; 7 always out
    assert banned_by_words[0] == [True, True, False, False]
    assert banned_by_words[2] == [True, False, True, False]
    assert banned_by_words[3][3] and banned_by_words[4][3]


def test_a_ban_that_would_leave_nothing_is_dropped_for_that_row():
    """Only token 7 allowed, and a word bans 7 after a 3: on that row the word is dropped and
    the allowed tokens stay; where a grammar already excludes every allowed token, the allowed
    tokens are dropped; where it leaves only a banned word, the word is."""
    req = Request("r", [1], SamplingParams(allowed_token_ids=[7], bad_words=["x"]))
    req.bad_words = BadWords([(3, 7)])
    req.output_token_ids, req.spec_token_ids = [3], [7]
    logits = torch.randn(2, VOCAB)
    want = logits.clone()
    apply_token_bans(logits, [(req, 1)])
    for j in range(2):  # after "3" (the word dropped) and after "3 7": only 7
        assert torch.isfinite(logits[j]).sum() == 1 and logits[j, 7] == want[j, 7]
    grammar = torch.full((1, VOCAB), float("-inf"))
    grammar[0, 9] = 1.0  # the grammar allows only 9, which allowed_token_ids forbids
    plain = Request("g", [1], SamplingParams(allowed_token_ids=[7]))
    apply_token_bans(grammar, [(plain, 0)])
    assert grammar[0, 9] == 1.0
    grammar = torch.full((1, VOCAB), float("-inf"))
    grammar[0, 5] = 2.0  # the grammar allows only 5, which a one-token word bans
    worded = Request("w", [1], SamplingParams(bad_words=["x"]))
    worded.bad_words = BadWords([(5,)])
    worded.grammar = object()  # a grammar narrows its rows
    apply_token_bans(grammar, [(worded, 0)])
    assert grammar[0, 5] == 2.0


def test_words_are_encoded_as_vllm_encodes_them(llm):
    """As a text starts, and after a space where that gives as many tokens starting with
    another one (vLLM's rule); a word the model cannot write is refused."""
    tok = llm.get_tokenizer()
    ids = bad_words_token_ids(tok, ["Paris", " hello world"], 49152)
    for text in ("Paris", " Paris", "hello world", " hello world"):
        assert tuple(tok.encode(text, add_special_tokens=False)) in ids
    assert len(ids) == len(set(ids)) == 4

    class Splitting:  # a tokenizer whose spaced word has a token more: only the plain one
        def encode(self, text, add_special_tokens):
            return [1, 2, 3] if text.startswith(" ") else [4, 5]
    assert bad_words_token_ids(Splitting(), ["ab"], 10) == [(4, 5)]
    with pytest.raises(ValueError, match="vocabulary"):
        bad_words_token_ids(Splitting(), ["ab"], 5)


def test_the_engine_keeps_to_bans_greedy_and_sampled(llm):
    tok = llm.get_tokenizer()
    prompt = PROMPTS[0]
    free = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16))[0].outputs[0]
    word = free.text.split()[0]
    banned = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16,
                                                   bad_words=[word]))[0].outputs[0]
    assert banned.text != free.text
    for ids in bad_words_token_ids(tok, [word], 49152):
        out = banned.token_ids
        assert not any(tuple(out[i:i + len(ids)]) == ids for i in range(len(out)))
    allowed = tok(" the a of and to in is", add_special_tokens=False).input_ids
    outs = llm.generate([prompt] * 3, [SamplingParams(temperature=1.0, seed=s, max_tokens=12,
                                                      allowed_token_ids=allowed)
                                       for s in range(3)])
    for out in outs:
        assert set(out.outputs[0].token_ids) <= set(allowed)


def test_conflicting_masks_finish_without_error(llm):
    """allowed_token_ids against a grammar, and allowed=[EOS] with min_tokens: the requests
    finish (the ban yields to the grammar and to min_tokens), next to a free request whose
    output is untouched."""
    eos = llm.get_tokenizer().eos_token_id
    prompt = PROMPTS[0]
    free = SamplingParams(temperature=0, max_tokens=8)
    outs = llm.generate([prompt] * 3, [
        SamplingParams(temperature=0, max_tokens=8, allowed_token_ids=[11, 12],
                       structured_outputs=StructuredOutputsParams(choice=["yes", "no"])),
        SamplingParams(temperature=1.0, seed=1, max_tokens=8, min_tokens=3,
                       allowed_token_ids=[eos]),
        free])
    assert outs[0].outputs[0].text in ("yes", "no")
    assert outs[1].outputs[0].finish_reason in ("stop", "length")
    alone = llm.generate([prompt], free)[0].outputs[0]
    assert outs[2].outputs[0].token_ids == alone.token_ids


@pytest.mark.parametrize("kwargs", [{"allowed_token_ids": []}, {"allowed_token_ids": [-1]},
                                    {"allowed_token_ids": "12"}, {"bad_words": "word"},
                                    {"bad_words": [" "]}, {"bad_words": [3]}])
def test_bad_values(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SamplingParams(**kwargs)


def test_allowed_token_ids_past_the_vocabulary_are_refused(llm):
    with pytest.raises(ValueError, match="allowed_token_ids"):
        llm.generate(["Hi"], SamplingParams(allowed_token_ids=[10**6]))
    assert not llm.engine.has_unfinished_requests()
