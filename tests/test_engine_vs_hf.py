"""Greedy output must be token-identical to Hugging Face transformers on the same weights."""

from __future__ import annotations

import pytest
from conftest import PROMPTS, hf_greedy

from specserve import SamplingParams

NEW_TOKENS = 64


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


def test_chunked_prefill_matches_unchunked(llm):
    """A prompt longer than the chunk limit computed in several steps gives the same tokens."""
    tok = llm.get_tokenizer()
    text = " ".join(f"Item {i} is a {'red' if i % 2 else 'blue'} box." for i in range(120))
    ids = tok(text, add_special_tokens=False).input_ids
    assert len(ids) > llm.engine.config.scheduler.long_prefill_token_threshold
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    llm.engine.block_manager.reset_prefix_cache()
    chunked = llm.generate([ids], params)[0].outputs[0].token_ids
    from specserve import LLM

    whole = LLM(dtype="float32", long_prefill_token_threshold=4096, max_num_batched_tokens=4096,
                enable_prefix_caching=False, kv_cache_memory=64 << 20)
    assert whole.generate([ids], params)[0].outputs[0].token_ids == chunked
