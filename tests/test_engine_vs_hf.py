"""Greedy output must be token-identical to Hugging Face transformers on the same weights."""

from __future__ import annotations

import pytest
import torch
from conftest import PROMPTS, hf_greedy

from specserve import SamplingParams

NEW_TOKENS = 64
# Log-probability (nats) by which a bf16 pick may trail fp32's best token: a near-tie.
NEAR_TIE = 0.5


@pytest.fixture(scope="module")
def hf_reference(llm, hf_model):
    tok = llm.get_tokenizer()
    prompts = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]
    return prompts, hf_greedy(hf_model, prompts, NEW_TOKENS)


def test_each_prompt_alone_matches_hf(llm, hf_reference):
    prompts, expected = hf_reference
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    for prompt, want in zip(prompts, expected, strict=True):
        got = llm.generate([prompt], params)[0].outputs[0].token_ids
        assert got == want


def test_inside_mixed_batch_of_32_matches_hf(llm, hf_reference):
    """The 8 reference prompts among 24 fillers of other lengths and output lengths, all in one
    continuous batch, with a small token budget so prefill chunks mix with decodes."""
    prompts, expected = hf_reference
    tok = llm.get_tokenizer()
    batch, params = [], []
    for i in range(32):
        if i % 4 == 0:
            batch.append(prompts[i // 4])
            params.append(SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True))
        else:
            text = f"Request {i}: " + f"tell me about the number {i}. " * (1 + i % 7)
            batch.append(tok(text, add_special_tokens=False).input_ids)
            params.append(SamplingParams(temperature=0, max_tokens=8 + 5 * (i % 11),
                                         ignore_eos=True))
    outs = llm.generate(batch, params)
    for i in range(0, 32, 4):
        assert outs[i].outputs[0].token_ids == expected[i // 4]
    for out, p in zip(outs, params, strict=True):
        assert len(out.outputs[0].token_ids) == p.max_tokens
    assert llm.get_stats()["kv_blocks_free"] == llm.get_stats()["kv_blocks_total"]


def _long_prompt(tok) -> list[int]:
    text = " ".join(f"Item {i} is a {'red' if i % 2 else 'blue'} box." for i in range(160))
    return tok(text, add_special_tokens=False).input_ids


def test_chunked_prefill_of_a_long_prompt_matches_hf(llm, hf_model):
    """A prompt longer than the chunk limit, computed in several steps, and its reply at
    positions past 1,000: transformers' tokens (the kernels' own tests stop at ~300)."""
    ids = _long_prompt(llm.get_tokenizer())
    assert len(ids) > 2 * llm.engine.config.scheduler.long_prefill_token_threshold
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    llm.engine.block_manager.reset_prefix_cache()
    chunked = llm.generate([ids], params)[0].outputs[0].token_ids
    assert chunked == hf_greedy(hf_model, [ids], 16)[0]


def test_the_bf16_engine_tracks_transformers_fp32(llm, hf_model):
    """The default dtype on this CPU is bf16, which no token-exact anchor can hold: along the
    bf16 engine's own greedy path (short prompts and a 1k-token one), every token it picked is
    transformers' fp32 argmax or within a near-tie of it, and most are the argmax itself. A
    rope, norm or KV path computed at the wrong precision or position drifts far past that."""
    from specserve import LLM

    tok = llm.get_tokenizer()
    prompts = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS[:4]]
    prompts.append(_long_prompt(tok))
    bf16 = LLM(dtype="bfloat16", kv_cache_memory=64 << 20)
    outs = bf16.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    gaps = []
    for prompt, out in zip(prompts, outs, strict=True):
        reply = out.outputs[0].token_ids
        with torch.inference_mode():
            logits = hf_model(torch.tensor([prompt + reply])).logits[0].float()
        logp = torch.log_softmax(logits[len(prompt) - 1:-1], -1)
        chosen = logp[torch.arange(len(reply)), torch.tensor(reply)]
        gaps += (logp.max(-1).values - chosen).tolist()
    assert max(gaps) < NEAR_TIE, max(gaps)
    assert sum(g == 0 for g in gaps) >= 0.9 * len(gaps)


def _hf_logprobs(hf_model, ids: list[int]) -> torch.Tensor:
    """transformers' log-probabilities at each position but the last: row p scores ids[p + 1]."""
    with torch.inference_mode():
        return torch.log_softmax(hf_model(torch.tensor([ids])).logits[0, :-1].float(), -1)


def test_prompt_logprobs_match_transformers(llm, hf_model):
    """Each prompt token's logprob given the tokens before it, its rank and the top 3, as
    transformers computes them: a long prompt scored across prefill chunks next to a short one,
    and the long one again once the prefix cache holds it (a cached position computes no
    logits: the request must not read the cache, or it would score nothing there)."""
    tok = llm.get_tokenizer()
    long_ids = _long_prompt(tok)
    short_ids = tok(PROMPTS[0], add_special_tokens=False).input_ids
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, prompt_logprobs=3)
    bm = llm.engine.block_manager
    bm.reset_prefix_cache()
    queries = bm.num_prefix_queries
    first = llm.generate([long_ids, short_ids], params)
    again = llm.generate([long_ids], params)[0]
    assert again.metrics.num_cached_tokens == 0
    assert bm.num_prefix_queries == queries  # not lookups: they would dilute the hit rate
    # A request without prompt logprobs still reads what the scoring requests cached.
    plain = llm.generate([long_ids], SamplingParams(temperature=0, max_tokens=2))[0]
    assert plain.metrics.num_cached_tokens >= len(long_ids) - bm.block_size
    assert plain.prompt_logprobs is None
    for ids, out in [(long_ids, first[0]), (short_ids, first[1]), (long_ids, again)]:
        scored = out.prompt_logprobs
        assert len(scored) == len(ids) and scored[0] is None
        ref = _hf_logprobs(hf_model, ids)
        for p, entry in enumerate(scored[1:]):
            token, want = ids[p + 1], ref[p]
            assert entry[token].logprob == pytest.approx(float(want[token]), abs=2e-3)
            assert entry[token].decoded_token == tok.decode([token])
            # its rank, up to tokens within a hair of it (fp32 sums in another order)
            v = float(want[token])
            assert int((want > v + 1e-3).sum()) + 1 <= entry[token].rank <= \
                int((want >= v - 1e-3).sum())
            ours = sorted((lp.logprob for t, lp in entry.items()
                           if lp.rank <= 3), reverse=True)
            assert ours == pytest.approx(want.topk(3).values.tolist(), abs=2e-3)
            for t, lp in entry.items():
                assert lp.logprob == pytest.approx(float(want[t]), abs=2e-3)
