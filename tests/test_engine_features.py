"""End-to-end engine behaviour on the real model: prefix caching, preemption, aborts, seeds,
stop conditions, bad input."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specserve import LLM, SamplingParams
from specserve.config import CacheConfig, SchedulerConfig

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _long_prefix(llm, n_tokens: int) -> list[int]:
    tok = llm.get_tokenizer()
    text = " ".join(f"Section {i}: the committee reviewed budget line {i * 7}." for i in range(200))
    return tok(text, add_special_tokens=False).input_ids[:n_tokens]


def test_prefix_cache_computes_only_new_blocks(llm):
    bm = llm.engine.block_manager
    prefix = _long_prefix(llm, 640)
    tail_a, tail_b = [264, 1345, 30], [1094, 2988, 314, 42]
    llm.generate([prefix + tail_a], GREEDY)
    queries, hits = bm.num_prefix_queries, bm.num_prefix_hits
    computed_before = llm.engine.stats.num_prompt_tokens
    out = llm.generate([prefix + tail_b], GREEDY)[0]
    hit = bm.num_prefix_hits - hits
    assert bm.num_prefix_queries - queries == len(prefix) + len(tail_b)
    assert hit == (len(prefix) // bm.block_size) * bm.block_size >= 512
    assert out.metrics.num_cached_tokens == hit
    # Only the uncached tail was computed.
    assert llm.engine.stats.num_prompt_tokens - computed_before == len(prefix) + len(tail_b) - hit
    uncached = LLM(dtype="float32", enable_prefix_caching=False, kv_cache_memory=64 << 20)
    assert uncached.generate([prefix + tail_b], GREEDY)[0].outputs[0].token_ids == \
        out.outputs[0].token_ids


def test_a_cache_salt_keeps_each_tenants_prefix_to_itself(llm):
    """vLLM's cache_salt, in a prompt dict or SamplingParams: a prefix is served only to
    requests with the same salt, and the text does not depend on it."""
    text = " ".join(f"Tenant note {i}: the salt keeps line {i * 3} apart." for i in range(40))
    ids = llm.get_tokenizer()(text, add_special_tokens=False).input_ids[:64] + [264, 1345, 30]

    def run(salt: str | None, in_params: bool = False):
        prompt = {"prompt_token_ids": ids} if in_params or salt is None else \
            {"prompt_token_ids": ids, "cache_salt": salt}
        params = replace(GREEDY, cache_salt=salt) if in_params else GREEDY
        return llm.generate([prompt], params)[0]
    first = run("tenant-a")
    assert run("tenant-b").metrics.num_cached_tokens == 0
    assert run(None).metrics.num_cached_tokens == 0
    again = run("tenant-a", in_params=True)
    assert again.metrics.num_cached_tokens == 64
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


def test_requests_arriving_with_a_shared_prefix_compute_it_once(llm):
    """Three prompts over one 640-token document, submitted together: the document is prefilled
    once (the other two wait for its blocks), and every output equals the prompt's own."""
    bm = llm.engine.block_manager
    prefix = _long_prefix(llm, 640)
    prompts = [prefix + tail for tail in ([264, 1345, 30], [1094, 2988, 314, 42], [504, 77])]
    bm.reset_prefix_cache()
    computed_before = llm.engine.stats.num_prompt_tokens
    outs = llm.generate(prompts, GREEDY)
    shared = (len(prefix) // bm.block_size) * bm.block_size
    assert [o.metrics.num_cached_tokens for o in outs] == [0, shared, shared]
    assert llm.engine.stats.num_prompt_tokens - computed_before == \
        len(prompts[0]) + sum(len(p) - shared for p in prompts[1:])
    uncached = LLM(dtype="float32", enable_prefix_caching=False, kv_cache_memory=64 << 20)
    assert [o.outputs[0].token_ids for o in outs] == \
        [uncached.generate([p], GREEDY)[0].outputs[0].token_ids for p in prompts]


def test_preemption_with_a_quarter_of_the_needed_pool(llm):
    tok = llm.get_tokenizer()
    prompts = [tok(f"Story {i}: once upon a time in village number {i}, there lived",
                   add_special_tokens=False).input_ids for i in range(16)]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    reference = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    bs = 16
    needed = sum(-(-(len(p) + 48) // bs) for p in prompts)
    small = LLM(dtype="float32", num_blocks=needed // 4, block_size=bs)
    outs = small.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == reference
    stats = small.get_stats()
    assert stats["num_preemptions"] > 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    # Aborts in the middle of a preempting run also give every block back.
    engine = small.engine
    ids = [engine.add_request(p, params).request_id for p in prompts]
    for _ in range(12):
        engine.step()
    for rid in ids[::2]:
        engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_follow_up_on_the_second_reply_to_a_prompt_is_served_that_reply(llm):
    """A prompt of whole blocks answered twice: the second request computes the prompt's last
    block again, and its reply's blocks must still be found by a follow-up turn on it (they
    chained to an unservable copy of that block: the turn recomputed the whole reply)."""
    bm = llm.engine.block_manager
    bs = bm.block_size
    doc = _long_prefix(llm, 4 * bs)
    bm.reset_prefix_cache()
    replies = [llm.generate([doc], SamplingParams(temperature=1.0, seed=s, max_tokens=3 * bs,
                                                  ignore_eos=True))[0].outputs[0].token_ids
               for s in (1, 2)]
    assert replies[0] != replies[1]
    turn = doc + list(replies[1]) + _long_prefix(llm, 8)[-5:]
    out = llm.generate([turn], SamplingParams(max_tokens=1))[0]
    # the reply's last token was sampled, never fed back: its KV is not computed
    assert out.metrics.num_cached_tokens == (len(doc) + len(replies[1]) - 1) // bs * bs


def test_n_choices_per_prompt_as_vllm_returns_them(llm):
    """SamplingParams(n=3) gives each prompt one RequestOutput with three completions; choice j
    is the request seeded seed + j, and a long prompt is prefilled once for all three."""
    bm = llm.engine.block_manager
    doc = _long_prefix(llm, 600)
    short = llm.get_tokenizer()("Tell me a story.", add_special_tokens=False).input_ids
    params = SamplingParams(n=3, temperature=1.0, seed=41, max_tokens=12, ignore_eos=True)
    bm.reset_prefix_cache()
    computed_before = llm.engine.stats.num_prompt_tokens
    outs = llm.generate([doc, short], params)
    assert len(outs) == 2
    assert llm.engine.stats.num_prompt_tokens - computed_before == \
        len(doc) + 2 * (len(doc) % bm.block_size or bm.block_size) + 3 * len(short)
    for prompt, out in zip([doc, short], outs, strict=True):
        assert out.finished and out.prompt_token_ids == prompt
        assert [c.index for c in out.outputs] == [0, 1, 2]
        for j, c in enumerate(out.outputs):
            alone = SamplingParams(temperature=1.0, seed=41 + j, max_tokens=12, ignore_eos=True)
            assert c.token_ids == llm.generate([prompt], alone)[0].outputs[0].token_ids
        assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    mixed = llm.generate([short, short], [SamplingParams(n=2, max_tokens=2, ignore_eos=True),
                                          SamplingParams(max_tokens=3, ignore_eos=True)])
    assert [len(o.outputs) for o in mixed] == [2, 1] and len(mixed[1].outputs[0].token_ids) == 3
    with pytest.raises(ValueError, match="one sequence per request"):
        llm.engine.add_request(short, params)
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=2**64)
    # all or none: a bad prompt after good ones leaves nothing queued
    with pytest.raises(ValueError, match="empty"):
        llm.generate([short, []], params)
    assert not llm.engine.has_unfinished_requests()


def test_vllm_prompt_forms_and_use_tqdm(llm):
    """Code written for vLLM passes prompts as dicts and use_tqdm; both work here."""
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    text = "The capital of France is"
    want = llm.generate([text], greedy)[0]
    as_text = llm.generate({"prompt": text}, greedy, use_tqdm=True)
    as_ids = llm.generate([{"prompt_token_ids": want.prompt_token_ids}], greedy)
    assert [o.outputs[0].token_ids for o in as_text + as_ids] == [want.outputs[0].token_ids] * 2
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.generate([{"text": text}], greedy)
    with pytest.raises(ValueError, match="multi_modal_data"):
        llm.generate([{"prompt": text, "multi_modal_data": {"image": None}}], greedy)


def test_seeded_sampling_is_batch_independent(llm):
    tok = llm.get_tokenizer()
    prompt = tok("Tell me a story about a dragon.", add_special_tokens=False).input_ids
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=32,
                            ignore_eos=True)
    alone = llm.generate([prompt], params)[0].outputs[0].token_ids
    others = [tok(f"Other prompt {i}", add_special_tokens=False).input_ids for i in range(7)]
    mixed_params = [SamplingParams(temperature=1.0, max_tokens=20 + i, ignore_eos=True,
                                   seed=None if i % 2 else i) for i in range(7)]
    outs = llm.generate(others[:3] + [prompt] + others[3:], mixed_params[:3] + [params]
                        + mixed_params[3:])
    assert outs[3].outputs[0].token_ids == alone
    different = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=99, max_tokens=32,
                               ignore_eos=True)
    assert llm.generate([prompt], different)[0].outputs[0].token_ids != alone


def test_stop_strings_stop_tokens_eos_and_logprobs(llm):
    out = llm.generate(["1, 2, 3, 4,"], SamplingParams(temperature=0, max_tokens=40,
                                                        stop=[" 8"]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == " 8"
    assert out.text.strip().startswith("5, 6, 7") and " 8" not in out.text
    first = llm.generate(["1, 2, 3, 4,"], SamplingParams(temperature=0, max_tokens=3))[0]
    stop_id = first.outputs[0].token_ids[1]
    out = llm.generate(["1, 2, 3, 4,"], SamplingParams(temperature=0, max_tokens=40,
                                                        stop_token_ids=[stop_id]))[0].outputs[0]
    assert out.token_ids[-1] == stop_id and out.finish_reason == "stop"
    # The stop token's text is not output, streamed (a stop string that never matches makes
    # the engine keep the text as it goes) or not, unless include_stop_str_in_output.
    stop_text = llm.get_tokenizer().decode([stop_id])
    texts = {}
    for streamed in (False, True):
        for include in (False, True):
            params = SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop_id],
                                    stop=["@@@"] if streamed else None,
                                    include_stop_str_in_output=include)
            texts[streamed, include] = llm.generate(["1, 2, 3, 4,"], params)[0].outputs[0].text
    assert texts[False, False] == texts[True, False] == out.text
    assert texts[False, True] == texts[True, True] == out.text + stop_text
    assert not out.text.endswith(stop_text)
    chat = llm.chat([{"role": "user", "content": "Say hello."}],
                    SamplingParams(temperature=0, max_tokens=200, logprobs=2))[0].outputs[0]
    assert chat.finish_reason == "stop"  # the chat model ends its turn with EOS
    assert chat.token_ids[-1] in llm.engine.model_config.eos_token_ids
    assert len(chat.logprobs) == len(chat.token_ids)
    assert all(len(lp) >= 2 and max(lp.values()) <= 0 for lp in chat.logprobs)
    # Greedy picks the top-1 token, so its logprob is the largest of the returned ones.
    assert all(lp[t] == max(lp.values()) for lp, t in zip(chat.logprobs, chat.token_ids,
                                                         strict=True))


def test_chat_options_render_as_the_template_does(llm):
    """LLM.chat renders as the server does: vLLM's continue_final_message leaves the assistant's
    last message open (the reply continues it), OpenAI's developer role is the system role
    for a template that predates it (SmolLM2's ChatML would print it as an unknown role), and
    text parts are joined (they raised a TypeError inside the template)."""
    tok = llm.engine.tokenizer
    params = SamplingParams(temperature=0, max_tokens=4)
    opened = [{"role": "user", "content": "Count to five"},
              {"role": "assistant", "content": "1, 2,"}]
    out = llm.chat(opened, params, add_generation_prompt=False, continue_final_message=True)[0]
    want = tok.apply_chat_template(opened, tokenize=False, continue_final_message=True)
    assert out.prompt_token_ids == tok(want, add_special_tokens=False).input_ids
    assert tok.decode(out.prompt_token_ids).endswith("1, 2,")
    assert out.prompt == want  # the rendered text, as vLLM's LLM.chat reports it
    with pytest.raises(ValueError, match="add_generation_prompt"):
        llm.chat(opened, params, continue_final_message=True)
    hello = [{"role": "user", "content": "Say hello."}]
    system = llm.chat([{"role": "system", "content": "Be brief."}, *hello], params)[0]
    developer = llm.chat([{"role": "developer", "content": "Be brief."}, *hello], params)[0]
    assert developer.prompt_token_ids == system.prompt_token_ids
    # OpenAI's text parts, joined by newlines as the server joins them
    parts = [{"type": "text", "text": "Say"}, {"type": "text", "text": "hello."}]
    joined = llm.chat([{"role": "user", "content": parts}], params)[0]
    assert joined.prompt_token_ids == llm.chat([{"role": "user", "content": "Say\nhello."}],
                                               params)[0].prompt_token_ids
    with pytest.raises(ValueError, match="text"):
        llm.chat([{"role": "user", "content": [{"type": "image_url"}]}], params)
    # a prompt dict streams as it generates
    streamed = list(llm.generate_stream({"prompt": "Say hello."}, params))[-1]
    assert streamed.prompt_token_ids == llm.generate("Say hello.", params)[0].prompt_token_ids


def test_min_tokens_keeps_stops_from_being_sampled(llm):
    """vLLM's min_tokens: until the output has that many tokens, no stop token (EOS included)
    is sampled and no stop string ends it; the tokens before the first would-be stop are the
    unconstrained ones."""
    hello = [{"role": "user", "content": "Say hello."}]
    free = llm.chat(hello, SamplingParams(temperature=0, max_tokens=200))[0].outputs[0]
    eos = set(llm.engine.model_config.eos_token_ids)
    assert free.token_ids[-1] in eos and free.finish_reason == "stop"
    n = len(free.token_ids)
    held = llm.chat(hello, SamplingParams(temperature=0, max_tokens=n + 20, min_tokens=n + 5,
                                          logprobs=0))[0].outputs[0]
    assert len(held.token_ids) >= n + 5
    assert not eos & set(held.token_ids[:n + 5])
    assert held.token_ids[:n - 1] == free.token_ids[:-1]
    # Logprobs are the model's own, not the masked distribution's: where the free reply ended,
    # EOS is still the top entry, with the logprob the free run reported for it.
    ranked = llm.chat(hello, SamplingParams(temperature=0, max_tokens=n + 1, min_tokens=n + 1,
                                            logprobs=1))[0].outputs[0]
    free_lp = llm.chat(hello, SamplingParams(temperature=0, max_tokens=200,
                                             logprobs=1))[0].outputs[0].logprobs
    top_at_end = max(ranked.logprobs[n - 1].items(), key=lambda kv: kv[1])
    assert top_at_end[0] == free.token_ids[-1] and top_at_end[0] != ranked.token_ids[n - 1]
    assert top_at_end[1] == pytest.approx(free_lp[n - 1][free.token_ids[-1]], abs=1e-5)
    # vLLM's Logprob fields: the EOS held back by min_tokens was the likeliest (rank 1), the
    # token sampled in its place ranks below it.
    assert ranked.logprobs[n - 1][top_at_end[0]].rank == 1
    sampled = ranked.logprobs[n - 1][ranked.token_ids[n - 1]]
    assert sampled.rank > 1 and sampled.logprob == float(sampled)
    tok = llm.get_tokenizer()
    assert all(lp.decoded_token == tok.decode([t]) for t, lp in ranked.logprobs[n - 1].items())
    # the stop string occurs early, but only a later occurrence may end the output
    counting = SamplingParams(temperature=0, max_tokens=60, stop=[","], min_tokens=6)
    out = llm.generate(["1, 2, 3, 4,"], counting)[0].outputs[0]
    assert out.finish_reason == "stop" and len(out.token_ids) >= 6 and "," in out.text
    # A stop string in the first min_tokens tokens, here the very first, ends nothing: with
    # min_tokens=1 the reply is not empty (as a stop token may not be the first either).
    first = llm.generate(["1, 2, 3, 4,"], SamplingParams(temperature=0, max_tokens=8))[0]
    text = tok.decode(first.outputs[0].token_ids[:1])
    out = llm.generate(["1, 2, 3, 4,"], SamplingParams(temperature=0, max_tokens=8, stop=[text],
                                                       min_tokens=1))[0].outputs[0]
    assert out.text.startswith(text) and len(out.token_ids) > 1


def test_prompt_logprobs_survive_chunks_preemption_and_n(llm):
    """Prompts scored in chunks of 16 tokens in a pool a quarter of the size the batch needs, so
    that requests are preempted and recomputed: every prompt is scored once, position by
    position as alone in a roomy engine, and the replies are unchanged. Choices of n > 1 each
    carry the scores (transformers' values: test_engine_vs_hf)."""
    tok = llm.get_tokenizer()
    prompts = [tok(f"Story {i}: " + "once upon a time in a village by the sea, " * (1 + i % 4),
                   add_special_tokens=False).input_ids for i in range(12)]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, prompt_logprobs=1)
    reference = llm.generate(prompts, params)
    bs = 16
    needed = sum(-(-(len(p) + 32) // bs) for p in prompts)
    small = LLM(dtype="float32", num_blocks=needed // 4, block_size=bs,
                long_prefill_token_threshold=16)
    schedule, partly_scored = small.engine.scheduler.schedule, []

    def counting_schedule():
        out = schedule()
        partly_scored.extend(r for r in out.preempted
                             if len(r.prompt_logprobs) < r.num_prompt_tokens)
        return out

    small.engine.scheduler.schedule = counting_schedule
    outs = small.generate(prompts, params)
    assert partly_scored  # preempted between two chunks of a prompt: it resumes mid-prompt
    for out, ref in zip(outs, reference, strict=True):
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
        assert len(out.prompt_logprobs) == len(out.prompt_token_ids)
        for got, want in zip(out.prompt_logprobs[1:], ref.prompt_logprobs[1:], strict=True):
            assert got.keys() == want.keys()
            for t in got:
                assert got[t].logprob == pytest.approx(want[t].logprob, abs=1e-4)
    # truncate_prompt_tokens keeps the last k prompt tokens, as if only they had been sent
    cut = llm.generate(prompts[-1:], replace(params, truncate_prompt_tokens=7))[0]
    alone = llm.generate([prompts[-1][-7:]], params)[0]
    assert cut.prompt_token_ids == prompts[-1][-7:]
    assert cut.outputs[0].token_ids == alone.outputs[0].token_ids
    # n > 1: choice 0 scores the prompt for all (the others share its prefill)
    two = llm.generate(prompts[-1:], replace(params, n=2, temperature=1.0, seed=3))[0]
    assert len(two.outputs) == 2
    assert [e and {t: round(v.logprob, 3) for t, v in e.items()} for e in two.prompt_logprobs] \
        == [e and {t: round(v.logprob, 3) for t, v in e.items()}
            for e in reference[-1].prompt_logprobs]


def test_truncating_a_text_keeps_the_bos_its_encoding_added():
    """vLLM's truncate_prompt_tokens cuts a text with transformers' left truncation, which keeps
    the special tokens the tokenizer adds: a Llama prompt keeps its BOS. Token ids are cut as
    given."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from specserve.engine.prompts import truncate_prompt

    vocab = {"<s>": 0, "<unk>": 1, "a": 2, "b": 3, "c": 4, "d": 5}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 0)])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", unk_token="<unk>")
    ids = hf("a b c d").input_ids
    assert ids == [0, 2, 3, 4, 5]
    assert truncate_prompt(ids, 3, hf) == [0, 4, 5]
    assert truncate_prompt(ids, 3) == [3, 4, 5]
    assert truncate_prompt(ids, 5, hf) == ids and truncate_prompt(ids, 1, hf) == [5]


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(prompt_logprobs=21), "prompt_logprobs"),
    (dict(truncate_prompt_tokens=0), "truncate_prompt_tokens"),
    (dict(truncate_prompt_tokens=-2), "truncate_prompt_tokens"),
    (dict(prompt_logprobs=-1), "prompt_logprobs"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
])
def test_bad_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_kv_cache_memory_reads_sizes_as_the_cli_does():
    assert CacheConfig(kv_cache_memory="2GiB").kv_cache_memory == 2 << 30
    assert CacheConfig(kv_cache_memory="512 MiB").kv_cache_memory == 512 << 20
    assert CacheConfig(kv_cache_memory="0.25").kv_cache_memory == 0.25
    for bad in ("lots", "2 GB of it", "1.2.3GiB", "1.5"):  # 1.5: not bytes, not a fraction
        with pytest.raises(ValueError, match="cannot read memory size"):
            CacheConfig(kv_cache_memory=bad)
    with pytest.raises(ValueError, match="long_prefill_token_threshold"):
        SchedulerConfig(long_prefill_token_threshold=0)  # once a numpy error at the first step


def test_a_speculation_policy_is_checked_without_a_proposer(caplog):
    """Without a speculative_config a policy governs only grammar-forced drafts: a bad name is
    still refused, and a policy that drafts says that it has no proposer to draft with."""
    with pytest.raises(ValueError, match="unknown speculation policy"):
        LLM(dtype="float32", kv_cache_memory="64MiB", speculation_policy="sometimes")
    with caplog.at_level("WARNING", logger="specserve"):
        LLM(dtype="float32", kv_cache_memory="64MiB", speculation_policy="static")
    assert "no proposer" in caplog.text


def test_a_pool_too_small_for_one_block_names_only_what_is_configured():
    with pytest.raises(ValueError, match="does not cover one KV block") as caught:
        LLM(dtype="float32", kv_cache_memory="10KiB")
    assert "draft" not in str(caught.value)  # no draft was configured


def test_bad_prompts_are_refused_and_the_engine_keeps_serving(llm):
    engine = llm.engine
    good = engine.add_request("Hello", GREEDY)
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("", GREEDY)
    with pytest.raises(ValueError, match="maximum context length"):
        engine.add_request([1] * (engine.max_model_len + 5), GREEDY)
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request([10**9], GREEDY)
    done = []
    while engine.has_unfinished_requests():
        done += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in done] == [good.request_id]
    assert len(done[0].outputs[0].token_ids) == GREEDY.max_tokens


def test_unknown_model_path():
    with pytest.raises(ValueError, match="neither the embedded model"):
        LLM(model="/nonexistent/model/dir")


def test_streaming_deltas_add_up(llm):
    chunks = list(llm.generate_stream("The capital of France is",
                                      SamplingParams(temperature=0, max_tokens=12,
                                                     ignore_eos=True)))
    assert chunks[-1].finished
    assert sum(len(c.delta_token_ids) for c in chunks) == 12
    final = llm.generate(["The capital of France is"],
                         SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert chunks[-1].outputs[0].text == final.outputs[0].text


def test_a_stream_never_shows_text_a_stop_string_will_cut(llm):
    """Each streamed text is a prefix of the final one: the stop string's first characters are
    held back until they either complete it (and are cut) or cannot."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    free = llm.generate(["The capital of France is"], params)[0].outputs[0].text
    stop = free.strip().split()[3]  # a word the greedy reply reaches a few tokens in
    params.stop = [stop + " "]
    texts = [c.outputs[0].text for c in llm.generate_stream("The capital of France is", params)]
    assert texts[-1] == free[:free.index(stop + " ")]
    assert all(texts[-1].startswith(t) for t in texts)


def test_on_forward_runs_once_per_step_before_the_forward(llm):
    """The server hands the previous step's outputs out from this hook: it must fire exactly
    once per step, before the forward has changed any request, also on the layer-loop path
    (decode-only steps) and when nothing is scheduled."""
    engine = llm.engine
    engine.add_request("The capital of France is",
                       SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    seen: list[int] = []

    def hook() -> None:
        (req,) = engine.scheduler.running
        seen.append(req.num_output_tokens)

    steps = 0
    while engine.has_unfinished_requests():
        engine.step(on_forward=hook)
        steps += 1
    assert seen == [0, 1, 2, 3] and steps == 4  # prefill, then three decode steps
    calls = []
    assert engine.step(on_forward=lambda: calls.append(1)) == [] and calls == [1]


def test_a_raw_prompt_gets_the_tokenizers_bos_and_a_chat_none_added():
    """As vLLM and transformers encode them: a completion's prompt with the special tokens the
    tokenizer adds (Llama's and Mistral's BOS), a rendered chat template with none added (it
    writes its own)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from specserve.engine.prompts import encode_chat, encode_prompt

    vocab = {"<unk>": 0, "<s>": 1, "hello": 2, "world": 3}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")
    fast.chat_template = "<s> {% for m in messages %}{{ m['content'] }} {% endfor %}"
    assert encode_prompt(fast, "hello world") == [1, 2, 3]
    assert encode_chat(fast, [{"role": "user", "content": "hello"}],
                       add_generation_prompt=False) == [1, 2]


def test_llm_chat_adds_no_second_bos(tmp_path):
    """LLM.chat renders the template (which writes the BOS) and must not let the tokenizer add
    another, as a raw text prompt gets: Llama and Mistral saw two."""
    from tiny_models import VOCAB, make_tiny_model
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    path = make_tiny_model(tmp_path / "bos")
    vocab = {"<unk>": 0, "<eos>": 1} | {f"w{i}": i for i in range(2, VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="w2 $A", special_tokens=[("w2", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>",
                                   bos_token="w2")
    fast.chat_template = "w2 {% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(path)
    llm = LLM(str(path), dtype="float32", kv_cache_memory=8 << 20)
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    out = llm.chat([{"role": "user", "content": "w5 w6"}], params, add_generation_prompt=False)[0]
    assert out.prompt_token_ids == [2, 5, 6] and out.prompt == "w2 w5 w6 "
    assert llm.generate(["w5 w6"], params)[0].prompt_token_ids == [2, 5, 6]  # raw: one BOS


def test_generate_stream_deltas_join_to_the_text_and_params_set_late_are_normalised(llm):
    """delta_text is what each streamed output adds (it was always ""), and a stop string set on
    SamplingParams after construction is one stop string, not one per character."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    whole = llm.generate(["Write a short poem about the sea."], params)[0].outputs[0].text
    stop = params.stop = whole[10:14]  # set late, as a plain string
    outs = list(llm.generate_stream("Write a short poem about the sea.", params))
    final = outs[-1].outputs[0]
    assert final.text == whole[:whole.find(stop)] and final.stop_reason == stop
    assert "".join(o.delta_text for o in outs) == final.text
    assert any(o.delta_text for o in outs[:-1])  # text arrived before the end


def test_logprobs_carry_vllms_rank_and_stay_floats(llm):
    """Each entry is vLLM's Logprob (`.logprob`, `.rank`) and still a float: the greedy token
    ranks 1, the top-k entries 1..k in order, and the values read as numbers."""
    from specserve import Logprob

    out = llm.generate(["The capital of France is"],
                       SamplingParams(temperature=0, max_tokens=4, logprobs=3))[0].outputs[0]
    for token, entry in zip(out.token_ids, out.logprobs, strict=True):
        assert all(isinstance(lp, Logprob) for lp in entry.values())
        assert entry[token].rank == 1  # greedy
        by_rank = sorted(entry.values(), key=lambda lp: lp.rank)
        assert [lp.rank for lp in by_rank] == [1, 2, 3]
        assert [lp.logprob for lp in by_rank] == sorted(entry.values(), reverse=True)
        assert max(entry, key=entry.get) == token
    pairs = zip(out.token_ids, out.logprobs, strict=True)
    assert out.cumulative_logprob == pytest.approx(sum(e[t] for t, e in pairs))


def test_a_listed_eos_under_ignore_eos_is_reported_as_the_stop_reason(llm):
    """vLLM's stop_reason: None when the request ends at EOS, the token id when it ends at a
    stop_token_ids entry, which an EOS id listed with ignore_eos is (it was reported None)."""
    eos = llm.engine.model_config.eos_token_ids[0]
    free = llm.chat([{"role": "user", "content": "Say hello."}],
                    SamplingParams(temperature=0, max_tokens=200))[0].outputs[0]
    assert free.token_ids[-1] == eos and free.stop_reason is None
    listed = llm.chat([{"role": "user", "content": "Say hello."}],
                      SamplingParams(temperature=0, max_tokens=200, ignore_eos=True,
                                     stop_token_ids=[eos]))[0].outputs[0]
    assert listed.token_ids == free.token_ids and listed.stop_reason == eos
