"""Speculative decoding inside the continuous batch: lossless for every proposer, greedy and
random; rollback leaks nothing; mismatched drafts are refused."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import PROMPTS
from tiny_models import VOCAB, make_tiny_model

from specserve import LLM, SamplingParams

SPEC_CONFIGS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3},
    "suffix": {"method": "suffix", "num_speculative_tokens": 4},
    "self-draft": {"method": "draft", "num_speculative_tokens": 3, "draft_layers": 2},
}


@pytest.fixture(scope="module", params=list(SPEC_CONFIGS))
def spec_llm(request):
    # static: these tests are about the verifier being lossless, so every step must verify.
    return LLM(dtype="float32", speculative_config=SPEC_CONFIGS[request.param],
               speculation_policy="static")


def _mixed_batch(llm):
    """32 requests: the reference prompts and copy-friendly fillers, mixed lengths."""
    tok = llm.get_tokenizer()
    prompts, params = [], []
    for i in range(32):
        if i % 4 == 0:
            text = PROMPTS[i // 4]
        else:
            text = f'Copy this record {i} times: {{"id": {i}, "name": "item{i}", "ok": true}}\n'
        prompts.append(tok(text, add_special_tokens=False).input_ids)
        # every eighth also scores its prompt: prefill rows beside verification rows
        params.append(SamplingParams(temperature=0, max_tokens=10 + 2 * (i % 9),
                                     ignore_eos=True, prompt_logprobs=1 if i % 8 == 3 else None))
    return prompts, params


def test_greedy_speculation_is_token_identical(llm, spec_llm):
    prompts, params = _mixed_batch(llm)
    reference = llm.generate(prompts, params)
    expected = [o.outputs[0].token_ids for o in reference]
    # Alone (batch 1) ...
    for i in (1, 4):
        assert spec_llm.generate([prompts[i]], params[i])[0].outputs[0].token_ids == expected[i]
    # ... and inside one batch of 32 mixed requests.
    outs = spec_llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == expected
    for out, ref in zip(outs, reference, strict=True):
        assert (out.prompt_logprobs is None) == (ref.prompt_logprobs is None)
        for got, want in zip(out.prompt_logprobs or (), ref.prompt_logprobs or (), strict=True):
            assert (got is None and want is None) or got.keys() == want.keys() and all(
                abs(got[t] - want[t]) < 1e-4 for t in got)
    stats = spec_llm.get_stats()
    assert stats["num_draft_tokens"] > 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    if spec_llm.engine.proposer.name != "draft":  # the records are copied: drafts get accepted
        assert stats["num_accepted_tokens"] > 0


def test_min_tokens_under_speculation_matches_plain_decoding(llm, spec_llm):
    """Stop tokens are masked in the verifier's distribution too: a draft that guesses EOS
    before min_tokens is rejected, and greedy output equals plain decoding's."""
    hello = [{"role": "user", "content": "Say hello."}]
    free = llm.chat(hello, SamplingParams(temperature=0, max_tokens=200))[0].outputs[0]
    n = len(free.token_ids)
    params = SamplingParams(temperature=0, max_tokens=n + 12, min_tokens=n + 4)
    want = llm.chat(hello, params)[0].outputs[0].token_ids
    assert len(want) >= n + 4
    got = spec_llm.chat(hello, params)[0].outputs[0].token_ids
    assert got == want
    assert not set(llm.engine.model_config.eos_token_ids) & set(got[:n + 4])


def test_stop_inside_an_accepted_draft(llm):
    """A stop token or stop string met in the middle of accepted draft tokens ends the output
    exactly where plain decoding ends it; later accepted tokens are dropped, their logprobs
    too. Static K: the test needs drafts, whatever the controller would judge them worth on
    this machine."""
    spec = LLM(dtype="float32", speculative_config=SPEC_CONFIGS["ngram"],
               speculation_policy="static")
    dropped = _count_dropped_tokens(spec)
    prompt = 'Repeat: {"a": 1, "b": 2, "c": 3}\n{"a": 1, "b": 2, "c": 3}\n{"a": 1, "b": 2,'
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    ref = llm.generate([prompt], greedy)[0].outputs[0]
    stop_id = ref.token_ids[8]
    by_token = SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop_id], logprobs=1)
    want = llm.generate([prompt], by_token)[0].outputs[0]
    got = spec.generate([prompt], by_token)[0]
    assert got.outputs[0].token_ids == want.token_ids
    assert got.outputs[0].token_ids[-1] == stop_id
    assert got.metrics.num_accepted_tokens > 0
    assert sum(dropped) > 0  # the test met its case: accepted tokens past the stop
    _assert_same_logprobs(got.outputs[0], want)
    by_string = SamplingParams(temperature=0, max_tokens=40, stop=['"c"'], logprobs=1)
    want = llm.generate([prompt], by_string)[0].outputs[0]
    dropped.clear()
    got = spec.generate([prompt], by_string)[0].outputs[0]
    assert (got.text, got.finish_reason, got.stop_reason) == (want.text, "stop", '"c"')
    assert sum(dropped) > 0
    _assert_same_logprobs(got, want)
    stats = spec.get_stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def _count_dropped_tokens(llm) -> list[int]:
    """Spies on the engine: per emitting call, the emitted tokens a stop left out."""
    dropped: list[int] = []
    append = llm.engine._append_and_check

    def spy(req, tokens):
        before = req.num_output_tokens
        append(req, tokens)
        dropped.append(len(tokens) - (req.num_output_tokens - before))

    llm.engine._append_and_check = spy
    return dropped


def _assert_same_logprobs(got, want) -> None:
    """One logprob entry per returned token, each (and their sum) as plain decoding gives it."""
    assert len(got.logprobs) == len(got.token_ids) == len(want.logprobs)
    for token, g, w in zip(got.token_ids, got.logprobs, want.logprobs, strict=True):
        assert g[token] == pytest.approx(w[token], abs=1e-3)
    assert got.cumulative_logprob == pytest.approx(want.cumulative_logprob, abs=1e-2)


def test_a_seeded_sampled_request_gives_the_same_tokens_whatever_else_runs():
    """A seeded sampled request drafts nothing, so what it draws from its generator does not
    depend on the batch. batch-threshold:1 drafts for a request running alone and not in a
    batch of two: before the rule, the seeded request's tokens differed between the two."""
    spec = LLM(dtype="float32", speculative_config=SPEC_CONFIGS["ngram"],
               speculation_policy="batch-threshold:1")
    prompt = "List: apple, banana, cherry, apple, banana, cherry, apple, banana, cherry, apple,"
    seeded = SamplingParams(temperature=0.7, seed=11, max_tokens=32, ignore_eos=True)
    alone = spec.generate([prompt], seeded)[0]
    other = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    together = spec.generate([prompt, prompt], [seeded, other])
    assert together[0].outputs[0].token_ids == alone.outputs[0].token_ids
    assert alone.metrics.num_draft_tokens == together[0].metrics.num_draft_tokens == 0
    unseeded = spec.generate([prompt], SamplingParams(temperature=0.7, max_tokens=32))[0]
    assert unseeded.metrics.num_draft_tokens > 0  # alone, a request does draft here


def test_per_request_override_turns_speculation_off(llm):
    spec = LLM(dtype="float32", speculative_config=SPEC_CONFIGS["ngram"],
               speculation_policy="static")
    prompt = 'Repeat: {"a": 1, "b": 2}\n{"a": 1, "b": 2}\n{"a": 1,'
    on = spec.generate([prompt], SamplingParams(temperature=0, max_tokens=24))[0]
    off = spec.generate([prompt], SamplingParams(temperature=0, max_tokens=24,
                                                 num_speculative_tokens=0))[0]
    assert on.metrics.num_draft_tokens > 0 and off.metrics.num_draft_tokens == 0
    assert on.outputs[0].token_ids == off.outputs[0].token_ids


def test_the_chosen_k_histogram_counts_what_was_drafted(llm):
    """Under static K = 4 an n-gram request with no match drafts nothing that step: the
    histogram (and the Prometheus chosen-K metric built on it) says 0 there, not 4."""
    spec = LLM(dtype="float32", speculative_config=SPEC_CONFIGS["ngram"],
               speculation_policy="static")
    prompts, params = _mixed_batch(llm)
    spec.generate(prompts[:8], params[:8])
    stats = spec.get_stats()
    hist = stats["spec_k_histogram"]
    assert hist.get(0, 0) > 0 and 0 < stats["num_draft_tokens"]
    assert sum(k * n for k, n in hist.items()) == stats["num_draft_tokens"]


def test_a_standing_plan_ends_with_a_request_it_was_made_for():
    """An all-zero plan stands for a few steps while the same requests run; a request that
    ends (aborted, and maybe sent again under its client-chosen id) ends it."""
    planner = LLM(dtype="float32", speculative_config=SPEC_CONFIGS["ngram"],
                  speculation_policy="static").engine.planner
    planner._idle_plan = (2, False, frozenset({"a", "b"}))
    planner.forget("c")
    assert planner._idle_plan is not None
    planner.forget("a")
    assert planner._idle_plan is None


def test_a_request_that_may_not_draft_is_not_planned_for():
    """num_speculative_tokens 0 (the server's `"speculation": 0`, a beam search's beams) under
    the adaptive policy is `off` for that request: no plan or look-up each step."""
    spec = LLM(dtype="float32", speculative_config=SPEC_CONFIGS["ngram"])
    planner, plans = spec.engine.planner, []
    choose = planner._choose
    planner._choose = lambda *args: plans.append(1) or choose(*args)
    prompt = 'Repeat: {"a": 1, "b": 2}\n{"a": 1, "b": 2}\n{"a": 1,'
    spec.generate([prompt], SamplingParams(temperature=0, max_tokens=16,
                                           num_speculative_tokens=0))
    assert not plans
    spec.generate([prompt], SamplingParams(temperature=0, max_tokens=16))
    assert plans


def test_pools_are_free_after_aborts_and_preemptions(llm):
    tok = llm.get_tokenizer()
    prompts = [tok(f"Tale {i}: the fox and the crow met at dawn near mill {i}, and",
                   add_special_tokens=False).input_ids for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    reference = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    # static: the draft pool is in use whenever a request runs (adaptive may never draft with
    # a 2-layer self-draft, and then the pools would be free trivially).
    spec = LLM(dtype="float32", num_blocks=14, block_size=16, speculation_policy="static",
               speculative_config=SPEC_CONFIGS["self-draft"])
    assert [o.outputs[0].token_ids for o in spec.generate(prompts, params)] == reference
    engine = spec.engine
    assert engine.stats.num_preemptions > 0 and engine.stats.num_draft_tokens > 0
    ids = [engine.add_request(p, params).request_id for p in prompts]
    for _ in range(10):
        engine.step()
    assert engine.proposer.block_manager.num_free_blocks < engine.proposer.block_manager.num_blocks
    for rid in ids[1::2]:
        engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()
    draft_bm = engine.proposer.block_manager
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert draft_bm.num_free_blocks == draft_bm.num_blocks
    assert engine.proposer.seqs == {}


def _assert_draft_cache_holds_true_kv(spec) -> int:
    """Every block the draft model's prefix cache could serve holds the KV the draft computes
    for the block's tokens after its prefix (recomputed alone, in a fresh engine's draft pool).
    Returns the number of blocks checked."""
    draft = spec.engine.proposer
    bm, bs = draft.block_manager, draft.block_manager.block_size
    fresh = LLM(dtype="float32", speculative_config=SPEC_CONFIGS["self-draft"],
                enable_prefix_caching=False).engine.proposer
    checked = 0
    for block_id in bm.cached.values():
        chain, block = [], bm.blocks[block_id]
        while block is not None:  # back to the first block, through live parent links
            chain.append(block)
            if block.parent is None or block.parent[0] == "salt":  # a first block
                block = None
            else:
                parent = bm.blocks[block.parent[0]]
                if parent.generation != block.parent[1] or parent.block_hash is None:
                    chain = []  # the parent was evicted: no lookup reaches this block
                    break
                block = parent
        if not chain:
            continue
        tokens = [t for b in reversed(chain) for t in b.token_ids]
        seq = SimpleNamespace(all_token_ids=tokens, num_tokens=len(tokens), spec_token_ids=[],
                              num_computed_tokens=0, block_ids=[], block_hashes=[])
        assert fresh.block_manager.allocate(seq, len(tokens))
        fresh.runner.execute(fresh.runner.prepare([(seq, len(tokens))]),
                             torch.tensor([len(tokens) - 1]))
        got = torch.arange(bs) + block_id * bs
        want = torch.arange(bs) + seq.block_ids[-1] * bs
        for mine, ref in zip(draft.runner.kv_caches, fresh.runner.kv_caches, strict=True):
            torch.testing.assert_close(mine.k[got], ref.k[want], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(mine.v[got], ref.v[want], rtol=1e-4, atol=1e-4)
        fresh.block_manager.free(seq)
        checked += 1
    return checked


def test_a_draft_model_serves_a_shared_prefix_from_its_own_prefix_cache(llm):
    """The second request over the same document finds the document's KV in the draft's pool
    (and the cost model is told so before it drafts), its tokens still those of plain decoding.
    Without the draft's cache it computes the whole document again."""
    tok = llm.get_tokenizer()
    doc = tok(" ".join(f"Fact {i}: the mill by the river {i} grinds {i * 3} sacks." for i in
                       range(8)), add_special_tokens=False).input_ids
    prompts = [doc + tok(q, add_special_tokens=False).input_ids
               for q in (" Question: what does mill 2 grind?", " Question: which mill is last?")]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    reference = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    shared = len(doc) // 16 * 16  # the document's full blocks
    assert shared >= 64
    computed = {}
    for caching in (True, False):
        spec = LLM(dtype="float32", speculative_config=SPEC_CONFIGS["self-draft"],
                   speculation_policy="static", enable_prefix_caching=caching)
        engine, draft = spec.engine, spec.engine.proposer
        assert spec.generate([prompts[0]], params)[0].outputs[0].token_ids == reference[0]
        before = draft.num_tokens_computed
        engine.set_speculation_policy("off")  # admitted and prefilled, not drafted for yet
        rid = engine.add_request(prompts[1], params).request_id
        engine.step()
        req = engine.requests[rid]
        assert draft.catch_up_tokens(req) == req.num_tokens - (shared if caching else 0)
        engine.set_speculation_policy("static")
        while engine.has_unfinished_requests():
            engine.step()
        assert req.output_token_ids == reference[1]
        computed[caching] = draft.num_tokens_computed - before
        assert spec.get_stats()["draft_prefix_cache_hits"] == (shared if caching else 0)
        if caching:
            assert _assert_draft_cache_holds_true_kv(spec) >= shared // 16
    assert computed[False] - computed[True] == shared


def test_a_drafts_catch_up_is_shared_even_if_it_never_drafts_again(llm):
    """A request's draft KV for a document is offered to the draft's prefix cache right after
    the forward that computed it: another request over the document finds it while the first,
    no longer drafting, still runs (before, only its next proposal or its end offered it)."""
    tok = llm.get_tokenizer()
    doc = tok(" ".join(f"Fact {i}: the mill by the river {i} grinds {i * 3} sacks." for i in
                       range(8)), add_special_tokens=False).input_ids
    first, second = (doc + tok(q, add_special_tokens=False).input_ids
                     for q in (" Question: what does mill 2 grind?", " Question: and mill 5?"))
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    spec = LLM(dtype="float32", speculative_config=SPEC_CONFIGS["self-draft"],
               speculation_policy="static")
    engine, draft = spec.engine, spec.engine.proposer
    engine.add_request(first, params)
    engine.step()  # prefilled; its first proposal caught the draft up on the document
    assert draft.num_forwards > 0
    engine.set_speculation_policy("off")
    rid = engine.add_request(second, params).request_id
    engine.step()
    req = engine.requests[rid]
    shared = len(doc) // 16 * 16
    assert draft.catch_up_tokens(req) == req.num_tokens - shared


def test_a_draft_rolls_back_its_guesses_when_the_token_budget_verifies_none(llm):
    """A 5-token budget fits one request's 3 drafts and only the next one's last token: its
    guesses are dropped unverified. The draft model must still roll back past them before it
    proposes again (and before its blocks may be cached): its computed tokens never run past
    the request's own."""
    tok = llm.get_tokenizer()
    prompts = [tok(f"Story {i}: once upon a time a small robot", add_special_tokens=False
                   ).input_ids for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    reference = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    spec = LLM(dtype="float32", speculative_config=SPEC_CONFIGS["self-draft"],
               speculation_policy="static", max_num_batched_tokens=5)
    draft = spec.engine.proposer
    ahead, none_verified = [], []
    propose, on_verified = draft.propose, draft.on_verified

    def checked_propose(reqs, num_tokens):
        for r, k in zip(reqs, num_tokens, strict=True):
            seq = draft.seqs.get(r.request_id)
            if k and seq is not None and seq.num_computed_tokens > r.num_tokens:
                ahead.append(r.request_id)
        return propose(reqs, num_tokens)

    def spied_on_verified(req, num_draft, num_accepted):
        if num_draft == 0:
            none_verified.append(req.request_id)
        on_verified(req, num_draft, num_accepted)

    draft.propose, draft.on_verified = checked_propose, spied_on_verified
    assert [o.outputs[0].token_ids for o in spec.generate(prompts, params)] == reference
    assert none_verified and not ahead
    assert _assert_draft_cache_holds_true_kv(spec) > 0


def test_draft_with_another_vocabulary_is_refused(tmp_path):
    path = make_tiny_model(tmp_path / "other", seed=1)
    with pytest.raises(ValueError, match="tokenizer does not match"):
        LLM(dtype="float32", speculative_config={"method": "draft", "model": str(path)})
    # The same tokenizer over an embedding padded to another size: q and p would not line up.
    target = make_tiny_model(tmp_path / "target", seed=2)
    padded = make_tiny_model(tmp_path / "padded", seed=3, vocab_size=VOCAB + 16)
    with pytest.raises(ValueError, match="same vocabulary size"):
        LLM(str(target), dtype="float32",
            speculative_config={"method": "draft", "model": str(padded)})


# ---- random sampling is lossless, measured on the engine ------------------------------------
def _chi2_critical(df: int, alpha_z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile; z = 3.09 is alpha = 1e-3."""
    return df * (1 - 2 / (9 * df) + alpha_z * math.sqrt(2 / (9 * df))) ** 3


def _chi2(counts: dict, probs: dict, n: int) -> tuple[float, int]:
    """Pearson's statistic, pooling cells with expected count < 5 into one."""
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for key, p in probs.items():
        exp, obs = p * n, counts.get(key, 0)
        if exp < 5:
            pooled_obs, pooled_exp = pooled_obs + obs, pooled_exp + exp
            continue
        stat += (obs - exp) ** 2 / exp
        cells += 1
    assert all(probs.get(key, 0) > 1e-12 for key in counts), \
        "a token with zero probability was emitted"
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    return stat, cells - 1


def _next_token_probs(model, prefixes: torch.Tensor, temperature: float, top_k: int = 0,
                      top_p: float = 1.0, min_p: float = 0.0) -> torch.Tensor:
    """The sampling distribution after temperature, min-p, top-k and top-p (the smallest set of
    the likeliest tokens whose mass reaches top_p), renormalised."""
    with torch.inference_mode():
        logits = model(prefixes).logits[:, -1].double()
    probs = (logits / temperature).softmax(-1)
    if min_p:
        probs = torch.where(probs >= min_p * probs.amax(-1, keepdim=True), probs, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    if top_k:
        kth = probs.topk(top_k, -1).values[:, -1:]
        probs = torch.where(probs >= kth, probs, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    if top_p < 1:
        sorted_p, order = probs.sort(-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass of the likelier tokens
        keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before < top_p)
        probs = torch.where(keep, probs, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def test_a_draft_with_a_shorter_context_drafts_only_within_it(tmp_path):
    """A draft model whose context ends before the target's (a 2k-token draft for a 4k-token
    target): requests past its length decode without drafts, instead of indexing past its
    rotary table (an IndexError that failed the whole engine)."""
    target = make_tiny_model(tmp_path / "target", seed=2)  # 256 positions
    short = make_tiny_model(tmp_path / "short", seed=2, max_position_embeddings=24)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompt = [5, 9, 13, 2, 40, 7, 7, 11]
    want = LLM(str(target), dtype="float32").generate([prompt], params)[0].outputs[0].token_ids
    spec = LLM(str(target), dtype="float32", speculation_policy="static",
               speculative_config={"method": "draft", "model": str(short),
                                   "num_speculative_tokens": 3})
    assert spec.generate([prompt], params)[0].outputs[0].token_ids == want
    assert 0 < spec.get_stats()["num_draft_tokens"] < 40
    # Past the draft's context a running request gives its draft blocks back at once.
    engine, draft = spec.engine, spec.engine.proposer
    req = engine.add_request(prompt, params)
    while req.num_tokens < 30:
        engine.step()
    assert draft.block_manager.num_free_blocks == draft.block_manager.num_blocks
    while engine.has_unfinished_requests():
        engine.step()
    assert req.output_token_ids == want
    # Under adaptive, past the draft's context a request is not planned (a plan's catch-up
    # made it a draft sequence again, and hashed its whole context, at every step).
    engine.set_speculation_policy("adaptive")
    req = engine.add_request(prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
        if req.num_tokens > 24:
            assert req.request_id not in draft.seqs
    assert req.output_token_ids == want


def test_a_draft_model_catches_up_a_long_prompt_in_chunks(tmp_path):
    """Off the CPU kernel (every GPU run) attention materialises its scores, so a draft's
    catch-up over a whole new prompt runs in chunks, guessing only after the last: the same
    tokens, and no draft forward longer than a chunk for any sequence."""
    target = make_tiny_model(tmp_path / "target", seed=2)
    draft = make_tiny_model(tmp_path / "draft", seed=5)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [[(5 * i + j) % 60 + 2 for i in range(30 + 7 * j)] for j in range(3)]
    want = [o.outputs[0].token_ids
            for o in LLM(str(target), dtype="float32").generate(prompts, params)]
    spec = LLM(str(target), dtype="float32", speculation_policy="static",
               speculative_config={"method": "draft", "model": str(draft),
                                   "num_speculative_tokens": 3})
    proposer = spec.engine.proposer
    proposer.catch_up_chunk = 8
    runs: list[int] = []
    prepare = proposer.runner.prepare

    def record(batch):
        runs.extend(n for _, n in batch)
        return prepare(batch)

    proposer.runner.prepare = record
    assert [o.outputs[0].token_ids for o in spec.generate(prompts, params)] == want
    assert max(runs) == 8 and spec.get_stats()["num_draft_tokens"] > 0


def test_an_explicit_draft_pool_is_paid_once_from_the_budget(tmp_path):
    """speculative_config's kv_cache_memory sizes the draft's pool: the target's pool gets what
    is left after the draft's weights and that pool (it was also charged the draft's bytes per
    target token, as if the draft pool matched its own)."""
    from specserve.engine.model_runner import kv_bytes_per_token

    target = make_tiny_model(tmp_path / "target", seed=2)
    draft = make_tiny_model(tmp_path / "draft", seed=5)
    budget, pool = 8 << 20, 1 << 20
    engine = LLM(str(target), dtype="float32", kv_cache_memory=budget,
                 speculative_config={"method": "draft", "model": str(draft),
                                     "kv_cache_memory": pool}).engine
    proposer, bs = engine.proposer, engine.block_manager.block_size
    token = kv_bytes_per_token(engine.model_config, torch.float32)
    left = budget - proposer.weight_bytes - pool
    assert engine.block_manager.num_blocks == left // (bs * token)
    assert proposer.block_manager.num_blocks == pool // (bs * proposer.kv_bytes_per_token)


def test_a_fractional_budget_charges_the_drafts_weights_once(tmp_path, monkeypatch):
    # Memory was measured after the draft loaded (its weights already gone from it), then the
    # weights were taken from the budget again. Simulated: free memory falls when it loads.
    import specserve.engine.llm_engine as llm_engine
    from specserve.engine.model_runner import kv_bytes_per_token

    target = make_tiny_model(tmp_path / "target", seed=2)
    draft = make_tiny_model(tmp_path / "draft", seed=5)
    free = {"bytes": 64 << 20}
    real_build = llm_engine.build_proposer

    def build(*args, **kwargs):
        proposer = real_build(*args, **kwargs)
        free["bytes"] -= proposer.weight_bytes
        return proposer

    monkeypatch.setattr(llm_engine, "_available_memory", lambda device: free["bytes"])
    monkeypatch.setattr(llm_engine, "build_proposer", build)
    engine = LLM(str(target), dtype="float32", kv_cache_memory=0.25,
                 speculative_config={"method": "draft", "model": str(draft)}).engine
    proposer, bs = engine.proposer, engine.block_manager.block_size
    per_token = kv_bytes_per_token(engine.model_config, torch.float32) + \
        proposer.kv_bytes_per_token
    expected = (int(0.25 * (64 << 20)) - proposer.weight_bytes) // (bs * per_token)
    assert engine.block_manager.num_blocks == expected


@pytest.mark.parametrize(("temperature", "top_k", "top_p", "min_p", "greedy_every"), [
    (0.8, 0, 1.0, 0.0, 0),
    # Filtered: verification must use the same top-k / top-p target as plain sampling; and
    # every 7th request greedy, so the draft's probability rows of a mixed batch must line up
    # with the right requests.
    (1.0, 12, 0.9, 0.0, 7),
    # min-p alone (here top-k and top-p would already drop what it drops): at 0.2 it removes
    # ~20% of the tempered mass, 27-40 of the 64 tokens.
    (0.8, 0, 1.0, 0.2, 5)])
def test_random_speculative_sampling_matches_the_target(tmp_path, temperature, top_k, top_p,
                                                        min_p, greedy_every):
    from transformers import AutoModelForCausalLM

    target_dir = make_tiny_model(tmp_path / "target", seed=11, logit_scale=2.0)
    draft_dir = make_tiny_model(tmp_path / "draft", seed=12, logit_scale=2.0)
    prompt, n = [5, 9, 13], 12000
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    # Exact target probabilities of the first three tokens: p(t1), p(t2|t1), p(t3|t1,t2).
    p1 = _next_token_probs(target, torch.tensor([prompt]), temperature, top_k, top_p, min_p)[0]
    pre2 = torch.tensor([prompt + [a] for a in range(VOCAB)])
    p2 = _next_token_probs(target, pre2, temperature, top_k, top_p, min_p)  # [t1, t2]
    pre3 = torch.tensor([prompt + [a, b] for a in range(VOCAB) for b in range(VOCAB)])
    p3 = _next_token_probs(target, pre3, temperature, top_k, top_p, min_p).view(VOCAB, VOCAB, VOCAB)
    # The draft must really differ from the target, or the test proves nothing.
    q2 = _next_token_probs(draft, pre2, temperature)
    tv = 0.5 * (p2 - q2).abs().sum(-1)
    assert float((p1 * tv).sum()) > 0.2

    llm = LLM(str(target_dir), dtype="float32", kv_cache_memory=128 << 20, max_num_seqs=256,
              speculation_policy="static",
              speculative_config={"method": "draft", "model": str(draft_dir),
                                  "num_speculative_tokens": 2, "kv_cache_memory": 64 << 20})
    sampled = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                             max_tokens=4,
                             ignore_eos=True)
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    is_greedy = [bool(greedy_every) and i % greedy_every == 0 for i in range(n)]
    outs = llm.generate([prompt] * n, [greedy if g else sampled for g in is_greedy])
    seqs = [tuple(o.outputs[0].token_ids[:3]) for o, g in zip(outs, is_greedy, strict=True)
            if not g]
    n = len(seqs)
    # The greedy requests, verified in the same batches, all took the one greedy path.
    assert len({tuple(o.outputs[0].token_ids) for o, g in zip(outs, is_greedy, strict=True)
                if g}) <= 1
    stats = llm.get_stats()
    # Both the accepted and the recovered paths were exercised, and bonus tokens occurred.
    assert 0.1 < stats["acceptance_rate"] < 0.9
    assert stats["mean_accepted_length"] > 1.1

    pair_probs = {(a, b): float(p1[a] * p2[a, b]) for a in range(VOCAB) for b in range(VOCAB)}
    pair_counts: dict = {}
    for s in seqs:
        pair_counts[s[:2]] = pair_counts.get(s[:2], 0) + 1
    stat, df = _chi2(pair_counts, pair_probs, n)
    assert stat < _chi2_critical(df), (stat, df)
    third = (p1[:, None, None] * p2[:, :, None] * p3).sum((0, 1))  # marginal of t3
    third_counts: dict = {}
    for s in seqs:
        third_counts[s[2]] = third_counts.get(s[2], 0) + 1
    stat, df = _chi2(third_counts, {t: float(third[t]) for t in range(VOCAB)}, n)
    assert stat < _chi2_critical(df), (stat, df)
    # Negative control: the draft's own distribution fails the same check on t2.
    draft_pairs = {(a, b): float(p1[a] * q2[a, b]) for a in range(VOCAB) for b in range(VOCAB)}
    stat, df = _chi2(pair_counts, draft_pairs, n)
    assert stat > _chi2_critical(df)


def _penalised_probs(model, prefixes: torch.Tensor, num_prompt: int, temperature: float,
                     penalty: float) -> torch.Tensor:
    """OpenAI's frequency and presence penalties (both `penalty`) over each prefix's output
    tokens (those after the first num_prompt), then temperature: what the engine samples
    from."""
    with torch.inference_mode():
        logits = model(prefixes).logits[:, -1].double()
    counts = torch.zeros_like(logits)
    if prefixes.shape[1] > num_prompt:
        counts.scatter_add_(1, prefixes[:, num_prompt:], torch.ones_like(
            prefixes[:, num_prompt:], dtype=counts.dtype))
    logits = logits - penalty * counts - penalty * (counts > 0)
    return (logits / temperature).softmax(-1)


@pytest.mark.parametrize(("method", "penalty"), [("ngram", 0.0), ("ngram", 1.5), ("suffix", 0.0)])
def test_random_sampling_with_ngram_drafts_matches_the_target(tmp_path, method, penalty):
    """n-gram drafts are point masses, and so are suffix decoding's (here from replies put in
    its cache, which outrank the prompt's own one-token matches): an accepted guess, a
    recovered token drawn from p without the guess, a bonus token, here under frequency and
    presence penalties (the first token's output counts in the second's row). The first three
    tokens' frequencies against the exact target distribution, end to end. (Whether a row
    counts the guesses before it is left to test_penalties.py: here too few rows follow an
    accepted guess to see it.)"""
    from transformers import AutoModelForCausalLM

    target_dir = make_tiny_model(tmp_path / "target", seed=11, logit_scale=5.0)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    # The target's own greedy text (a random model soon cycles): the look-up guesses what it
    # wrote before in the same place, which it samples again often enough for every path.
    with torch.inference_mode():
        prompt = target.generate(torch.tensor([[5, 9]]), max_new_tokens=40, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)[0].tolist()
    n, temperature = 12000, 0.8
    m = len(prompt)
    p1 = _penalised_probs(target, torch.tensor([prompt]), m, temperature, penalty)[0]
    p2 = _penalised_probs(target, torch.tensor([prompt + [a] for a in range(VOCAB)]), m,
                          temperature, penalty)
    llm = LLM(str(target_dir), dtype="float32", kv_cache_memory=128 << 20, max_num_seqs=256,
              speculation_policy="static",
              speculative_config={"method": method, "num_speculative_tokens": 2,
                                  "prompt_lookup_min": 1,
                                  "prompt_lookup_max": 3 if method == "ngram" else 1,
                                  # (keep the replies put in below: not one is evicted)
                                  **({"suffix_decoding_max_cached_requests": 2 * n}
                                     if method == "suffix" else {})})
    if method == "suffix":
        # Earlier replies that went on from the prompt's last 3 tokens: 6 the way the target
        # likes to (its greedy text), 4 another way: guesses with an estimate of 0.6 and 0.4.
        with torch.inference_mode():
            likely = target.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)[0, m:].tolist()
        for reply in [likely] * 6 + [[(t + 1) % VOCAB for t in likely]] * 4:
            llm.engine.proposer.replies.add(prompt[-3:] + reply)
    params = SamplingParams(temperature=temperature, frequency_penalty=penalty,
                            presence_penalty=penalty, max_tokens=4, ignore_eos=True)
    outs = llm.generate([prompt] * n, params)
    stats = llm.get_stats()
    if method == "suffix":
        from specserve.spec_decode.suffix import GLOBAL_LEVEL

        assert max(stats["spec_evidence_acceptance"]) > GLOBAL_LEVEL, stats
    assert stats["num_draft_tokens"] > n // 4, stats  # many requests drafted
    assert 0.05 < stats["acceptance_rate"] < 0.95, stats  # accepted and recovered paths ran
    counts: dict = {}
    for o in outs:
        key = tuple(o.outputs[0].token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
    probs = {(a, b): float(p1[a] * p2[a, b]) for a in range(VOCAB) for b in range(VOCAB)}
    stat, df = _chi2(counts, probs, n)
    assert stat < _chi2_critical(df), (stat, df)
    # The third token: its row is verified with the second's guess as history (the penalty
    # must count the guess as output there).
    p3 = _penalised_probs(target, torch.tensor([prompt + [a, b] for a in range(VOCAB)
                                                for b in range(VOCAB)]), m, temperature, penalty)
    third = (p1[:, None, None] * p2[:, :, None] * p3.view(VOCAB, VOCAB, VOCAB)).sum((0, 1))
    third_counts: dict = {}
    for o in outs:
        third_counts[o.outputs[0].token_ids[2]] = third_counts.get(o.outputs[0].token_ids[2], 0) + 1
    stat, df = _chi2(third_counts, {t: float(third[t]) for t in range(VOCAB)}, n)
    assert stat < _chi2_critical(df), (stat, df)
    if penalty:  # the control: the unpenalised distribution fails the same check
        plain2 = _penalised_probs(target, torch.tensor([prompt + [a] for a in range(VOCAB)]), m,
                                  temperature, 0.0)
        stat, df = _chi2(counts, {(a, b): float(p1[a] * plain2[a, b])
                                  for a in range(VOCAB) for b in range(VOCAB)}, n)
        assert stat > _chi2_critical(df)


def _ngram_scan(tokens: np.ndarray, k: int, n_min: int, n_max: int) -> tuple[list[int], int]:
    """The reference: a scan of the whole history for the latest earlier occurrence of the
    longest matching suffix n-gram (n_max >= n >= n_min), and that n. tokens: [num_tokens]
    int."""
    total = len(tokens)
    for n in range(min(n_max, total - 1), n_min - 1, -1):
        suffix = tokens[total - n:]
        # Windows starting at 0..total-n-1 (the suffix itself excluded).
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:total - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return tokens[start:start + k].tolist(), n
    return [], 0


def test_ngram_index_matches_the_full_scan_as_tokens_grow():
    """The proposer's incremental n-gram index answers exactly what a scan of the whole history
    does (the guesses and the match length they rest on), at every length, for every n range
    and K."""
    from specserve.spec_decode.ngram import NgramIndex

    rng = np.random.default_rng(0)
    # ids whose int32 bytes also match across token boundaries (0x0101 followed by 0 holds the
    # bytes of 1 at offset 1): the search must keep only whole-token hits
    straddling = [0, 1, 256, 257, 65537, 1 << 24]
    for (n_min, n_max), stride, ids in [((1, 4), 1, range(6)), ((2, 3), 1, range(6)),
                                        ((3, 3), 1, range(6)), ((1, 4), 7, range(6)),
                                        ((1, 4), 1, straddling), ((2, 3), 3, straddling)]:
        # few distinct tokens: many repeats and matches at every n; stride 7: looked up only
        # now and then (a request that did not speculate for a while)
        tokens = rng.choice(list(ids), size=300).tolist()
        index = NgramIndex(n_min, n_max)
        for total in range(1, len(tokens) + 1, stride):
            prefix = tokens[:total]
            k = 1 + total % 5
            want = _ngram_scan(np.asarray(prefix), k, n_min, n_max)
            assert index.lookup(prefix, k) == want, (n_min, n_max, total)
