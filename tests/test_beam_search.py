"""Beam search (vLLM's LLM.beam_search and the server's use_beam_search): the beams equal
transformers' beam search on the same weights, end-of-sequence beams are set aside and ranked
with the length penalty, and bad parameters are refused."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny_model

from specserve import LLM, BeamSearchParams
from specserve.beam_search import BeamSearch, BeamSearchSequence, beam_score
from specserve.outputs import Logprob

PROMPTS = [[5, 9, 13, 2, 40], [7] * 11, list(range(2, 30))]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("beam") / "m", seed=11, logit_scale=0.5)
    return path, LLM(str(path), dtype="float32", kv_cache_memory=16 << 20)


@pytest.mark.parametrize("width", [1, 3])
def test_beams_equal_transformers_beam_search(tiny, width):
    """Without an end of sequence every beam has the same length, so transformers' beams and
    their order are the ones to match (width 1 is greedy decoding)."""
    from transformers import AutoModelForCausalLM

    path, llm = tiny
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    outs = llm.beam_search(PROMPTS, BeamSearchParams(beam_width=width, max_tokens=12,
                                                     ignore_eos=True))
    for prompt, out in zip(PROMPTS, outs, strict=True):
        with torch.inference_mode():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12,
                              num_beams=width, num_return_sequences=width, do_sample=False,
                              eos_token_id=None, pad_token_id=0,
                              output_scores=True, return_dict_in_generate=True)
        want = ref.sequences[:, len(prompt):].tolist()
        assert [s.output_token_ids for s in out.sequences] == want
        assert all(s.tokens[:len(prompt)] == prompt and s.finish_reason == "length"
                   for s in out.sequences)
        if width > 1:  # (width 1 is greedy there: no beam scores)
            # transformers' sequence scores: the sum of logprobs / length (length_penalty 1)
            got = [s.cum_logprob / 12 for s in out.sequences]
            torch.testing.assert_close(torch.tensor(got), ref.sequences_scores.float(),
                                       atol=1e-4, rtol=0)
    assert not llm.engine.has_unfinished_requests()


def _lp(**tokens: float) -> dict[int, Logprob]:
    return {int(t[1:]): Logprob(v) for t, v in tokens.items()}


def test_finished_beams_are_set_aside_and_ranked_with_the_length_penalty():
    """A synthetic search (eos = 1): the end-of-sequence candidates leave the live beams, and
    the result ranks finished and live beams by cum_logprob / length ** length_penalty."""
    params = BeamSearchParams(beam_width=2, max_tokens=3, length_penalty=1.0)
    s = BeamSearch([9], params, eos_token_ids=[1])
    s.advance([_lp(t1=-0.5, t2=-1.0, t3=-2.0, t4=-3.0)])  # eos is the likeliest first token
    assert [b.tokens for b in s.beams] == [[9, 2], [9, 3]]
    assert [b.tokens for _, b in s.finished] == [[9, 1]]
    s.advance([_lp(t5=-0.1, t6=-3.0), _lp(t7=-0.2, t1=-0.3)])
    assert [b.tokens for b in s.beams] == [[9, 2, 5], [9, 3, 7]]
    s.advance([_lp(t8=-0.1), _lp(t8=-0.1)])
    assert s.done
    # Scores (the end-of-sequence token counts in the length): [9,1] -0.5 / 1; [9,2,5,8]
    # -1.2 / 3 = -0.4; [9,3,7,8] -2.3 / 3; [9,3,1] -2.3 / 2.
    from tiny_models import _tokenizer
    from transformers import PreTrainedTokenizerFast

    tok: PreTrainedTokenizerFast = _tokenizer()
    out = s.result(tok)
    assert [b.tokens for b in out.sequences] == [[9, 2, 5, 8], [9, 1]]
    assert [b.finish_reason for b in out.sequences] == ["length", "stop"]
    assert out.sequences[1].text == ""  # the end-of-sequence token is not in the text
    short = BeamSearchSequence([9, 1], cum_logprob=-0.5, num_prompt_tokens=1)
    assert beam_score(short, 0.0) == -0.5
    # A heavier penalty favours the longer beam more, a negative one the shorter.
    long = BeamSearchSequence([9, 2, 5, 8], cum_logprob=-1.2, num_prompt_tokens=1)
    assert beam_score(long, 2.0) > beam_score(short, 2.0)
    assert beam_score(long, -1.0) < beam_score(short, -1.0)


def _synthetic_result(penalty: float) -> list[list[int]]:
    """The search above, run under another length penalty: its beams, best first."""
    s = BeamSearch([9], BeamSearchParams(beam_width=2, max_tokens=3, length_penalty=penalty),
                   eos_token_ids=[1])
    s.advance([_lp(t1=-0.5, t2=-1.0, t3=-2.0, t4=-3.0)])
    if not s.done:
        s.advance([_lp(t5=-0.1, t6=-3.0), _lp(t7=-0.2, t1=-0.3)][:len(s.beams)])
    if not s.done:
        s.advance([_lp(t8=-0.1)] * len(s.beams))
    return [b.tokens for _, b in s.finished]


@pytest.mark.parametrize(("extreme", "moderate"), [(1000.0, 40.0), (-1000.0, -40.0), (10**6, 40)])
def test_an_extreme_length_penalty_ranks_without_overflow(extreme, moderate):
    """3 ** 1000 is past a float's range (Python raised OverflowError, and 3 ** -1000 is 0: a
    division by zero): the ranking is taken in log space, the same as a moderate penalty's."""
    assert _synthetic_result(extreme) == _synthetic_result(moderate)
    beam = BeamSearchSequence([9, 2, 5, 8], cum_logprob=-1.2, num_prompt_tokens=1)
    assert beam_score(beam, extreme) in (0.0, float("-inf"))  # the score itself, past the range


@pytest.mark.parametrize(("penalty", "stops"), [(0.0, True), (1.0, False), (-1.0, True)])
def test_the_search_stops_once_no_live_beam_can_enter_the_best(penalty, stops):
    """One finished beam at -0.1, the live one at -2 after one step: it can only fall, so it
    never beats -0.1 unless a positive penalty divides it by up to 100 ** penalty."""
    s = BeamSearch([9], BeamSearchParams(beam_width=1, max_tokens=100,
                                         length_penalty=penalty), eos_token_ids=[1])
    s.advance([_lp(t1=-0.1, t2=-2.0)])
    assert s.done is stops
    if not stops:
        s.advance([_lp(t1=-5.0, t3=-0.2)])
        assert [b.tokens for _, b in s.finished] == [[9, 1]] and not s.done


def test_an_eos_ends_beams_on_the_real_engine(tmp_path):
    """The tiny model with its most frequent greedy token as end of sequence: beams end there
    (at their first one), the others are cut at max_tokens, and the scores are in order."""
    from collections import Counter

    from specserve import SamplingParams

    path = make_tiny_model(tmp_path / "a", seed=11, logit_scale=3.0)
    greedy = LLM(str(path), dtype="float32", kv_cache_memory=16 << 20).generate(
        PROMPTS[:2], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    frequent = Counter(t for o in greedy for t in o.outputs[0].token_ids).most_common(1)[0][0]
    path = make_tiny_model(tmp_path / "b", seed=11, logit_scale=3.0, eos_token_id=frequent)
    llm = LLM(str(path), dtype="float32", kv_cache_memory=16 << 20)
    eos = llm.engine.model_config.eos_token_ids
    assert frequent in eos  # (beside the tokenizer's <eos>)
    # Without a length penalty short finished beams win here; with 1 the longest do.
    short = llm.beam_search(PROMPTS[:2], BeamSearchParams(beam_width=4, max_tokens=10,
                                                          length_penalty=0.0))
    long = llm.beam_search(PROMPTS[:2], BeamSearchParams(beam_width=4, max_tokens=10))
    assert "stop" in {s.finish_reason for o in short for s in o.sequences}
    assert "length" in {s.finish_reason for o in long for s in o.sequences}
    for out, penalty in [(o, 0.0) for o in short] + [(o, 1.0) for o in long]:
        assert len(out.sequences) == 4
        for s in out.sequences:
            gen = s.output_token_ids
            assert not any(t in eos for t in gen[:-1])
            assert s.finish_reason == ("stop" if gen[-1] in eos else "length")
            assert len(s.logprobs) == len(gen)
            assert sum(float(next(iter(e.values()))) for e in s.logprobs) == \
                pytest.approx(s.cum_logprob)
        scores = [beam_score(s, penalty) for s in out.sequences]
        assert scores == sorted(scores, reverse=True)
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize(("change", "error"), [
    ({"beam_width": 0}, "beam_width"), ({"beam_width": 11}, "beam_width"),
    ({"max_tokens": 0}, "max_tokens"), ({"temperature": 0.7}, "temperature"),
    ({"length_penalty": float("nan")}, "length_penalty")])
def test_bad_parameters_are_refused(tiny, change, error):
    _, llm = tiny
    with pytest.raises(ValueError, match=error):
        llm.beam_search(PROMPTS[:1], BeamSearchParams(**({"beam_width": 2, "max_tokens": 4}
                                                          | change)))


def test_a_prompt_that_cannot_grow_to_max_tokens_is_refused(tiny):
    _, llm = tiny
    with pytest.raises(ValueError, match="maximum context"):
        llm.beam_search([[5] * 250], BeamSearchParams(beam_width=2, max_tokens=10))
    assert not llm.engine.has_unfinished_requests()
