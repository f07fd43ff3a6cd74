"""Logit bias and presence / frequency / repetition penalties: the repetition penalty equals
transformers' on the same weights, every verification row is penalised as plain decoding would
be there (so speculation stays lossless), logprobs stay the model's own, bad values are refused."""

from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS

from specserve import LLM, SamplingParams
from specserve.engine.request import Request
from specserve.sample.penalties import apply_penalties

VOCAB = 50


def _reference_row(logits: torch.Tensor, params: SamplingParams, prompt: list[int],
                   output: list[int]) -> torch.Tensor:
    """One row, straight from the definitions (vLLM / OpenAI / transformers)."""
    row = logits.clone()
    for token, bias in (params.logit_bias or {}).items():
        row[token] += bias
    for token in set(prompt) | set(output):
        if params.repetition_penalty != 1:
            row[token] = (row[token] / params.repetition_penalty if row[token] > 0
                          else row[token] * params.repetition_penalty)
    for token in set(output):
        row[token] -= params.frequency_penalty * output.count(token) + params.presence_penalty
    return row


PARAMS = [
    SamplingParams(repetition_penalty=1.7),
    SamplingParams(frequency_penalty=0.6, presence_penalty=-0.4),
    SamplingParams(logit_bias={3: 5.0, 7: -100.0}),
    SamplingParams(repetition_penalty=0.8, frequency_penalty=1.0, presence_penalty=2.0,
                   logit_bias={0: 1.5}),
]


@pytest.mark.parametrize("params", PARAMS, ids=["repetition", "frequency+presence", "bias",
                                                "all"])
def test_each_verification_row_is_penalised_as_plain_decoding_would_be(params):
    """Rows of one step: a free request, the request under test verifying 3 drafts, another
    penalised request with other settings on its first decode step (no output yet), a free
    one. Some logits are already -inf (a grammar's or min_tokens' mask)."""
    torch.manual_seed(0)
    prompt, output, drafts = [1, 2, 3, 2], [4, 5, 4, 2], [5, 6, 5]
    req = Request("r", prompt, params)
    req.output_token_ids = list(output)
    req.spec_token_ids = list(drafts)
    first_step = Request("first", [4, 4, 9], PARAMS[3] if params is not PARAMS[3] else PARAMS[0])
    free = Request("free", [9], SamplingParams())
    logits = torch.randn(1 + len(drafts) + 1 + 1 + 1, VOCAB) * 3
    logits[:, 4] = float("-inf")
    want = logits.clone()
    apply_penalties(logits, [(free, 0), (req, len(drafts)), (first_step, 0), (free, 0)])
    assert torch.equal(logits[0], want[0]) and torch.equal(logits[-1], want[-1])
    for j in range(len(drafts) + 1):
        expected = _reference_row(want[1 + j], params, prompt, output + drafts[:j])
        torch.testing.assert_close(logits[1 + j], expected, rtol=0, atol=1e-5)
    expected = _reference_row(want[-2], first_step.params, first_step.prompt_token_ids, [])
    torch.testing.assert_close(logits[-2], expected, rtol=0, atol=1e-5)
    assert torch.isneginf(logits[:, 4]).all()


def test_repetition_penalty_matches_transformers(llm, hf_model):
    tok = llm.get_tokenizer()
    for text in PROMPTS[:3]:
        ids = tok(text, add_special_tokens=False).input_ids
        with torch.inference_mode():
            out = hf_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                                    repetition_penalty=1.3, eos_token_id=None, pad_token_id=0)
        want = out[0, len(ids):].tolist()
        got = llm.generate([ids], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True,
                                                 repetition_penalty=1.3))[0].outputs[0]
        plain = llm.generate([ids], SamplingParams(temperature=0, max_tokens=32,
                                                   ignore_eos=True))[0].outputs[0]
        assert got.token_ids == want
        assert got.token_ids != plain.token_ids or text == PROMPTS[2]


COPY = 'Copy this record 5 times: {"id": 7, "name": "item7", "ok": true}\n{"id": 7, "name": '
PENALISED = [
    SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, repetition_penalty=1.2),
    SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, frequency_penalty=0.8,
                   presence_penalty=0.3),
    SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logit_bias={11: 4.0}),
    # The record's words banned (its name's last token after "item"), then only its tokens:
    SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, bad_words=["item7", "ok"]),
    SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                   allowed_token_ids=sorted(set(range(20, 3000)) - {28, 29, 30, 31})),
]


def test_speculation_under_penalties_is_lossless(llm):
    """n-gram drafts copy the record; the penalties make the target turn away from it, so
    drafts are accepted and rejected at rows that carry earlier drafts' penalties."""
    spec = LLM(dtype="float32", speculation_policy="static", kv_cache_memory=64 << 20,
               speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                   "prompt_lookup_max": 3})
    prompts = [COPY] * len(PENALISED)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, PENALISED)]
    got = [o.outputs[0].token_ids for o in spec.generate(prompts, PENALISED)]
    assert got == want
    stats = spec.get_stats()
    assert stats["num_accepted_tokens"] > 0
    assert stats["num_draft_tokens"] > stats["num_accepted_tokens"]


def test_logit_bias_steers_and_logprobs_stay_the_models_own(llm):
    prompt = "The capital of France is"
    free = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4,
                                                 logprobs=1))[0].outputs[0]
    first = free.token_ids[0]
    banned = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4, logprobs=1,
                                                   logit_bias={first: -100.0}))[0].outputs[0]
    assert banned.token_ids[0] != first
    # The reported top-1 is still the model's favourite, at the logprob it had unbiased.
    assert max(banned.logprobs[0], key=banned.logprobs[0].get) == first
    assert banned.logprobs[0][first] == pytest.approx(free.logprobs[0][first], abs=1e-5)
    forced = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4,
                                                   logit_bias={42: 100}))[0].outputs[0]
    assert forced.token_ids == [42] * 4


@pytest.mark.parametrize("kwargs, field", [
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": float("nan")}, "repetition_penalty"),
    ({"repetition_penalty": 1e39}, "repetition_penalty"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ({"logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"logit_bias": {5: float("inf")}}, "logit_bias"),
    ({"logit_bias": {5: 101}}, "logit_bias"),
    ({"logit_bias": {5: True}}, "logit_bias"),
    ({"logit_bias": {True: 1.0}}, "logit_bias"),
    ({"presence_penalty": True}, "presence_penalty"),
])
def test_bad_penalty_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_a_repetition_penalty_above_2_is_accepted_as_in_vllm():
    assert SamplingParams(repetition_penalty=2.5).repetition_penalty == 2.5


def test_logit_bias_past_the_vocabulary_is_refused(llm):
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate(["Hi"], SamplingParams(logit_bias={10**6: 1.0}))
    assert not llm.engine.has_unfinished_requests()
