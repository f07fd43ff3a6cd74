"""Suffix decoding: guesses from earlier requests' replies, lossless in the engine, the cache
bounded and its eviction exact."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from specserve import LLM, SamplingParams
from specserve.spec_decode.config import SpeculativeConfig
from specserve.spec_decode.suffix import (
    GLOBAL_LEVEL,
    MAX_CANDIDATES,
    MAX_REPLY_TOKENS,
    ReplyCache,
    SuffixProposer,
    _hash,
)


def _reference_lookup(replies: list[list[int]], context: list[int], k: int, min_prob: float,
                      depth: int) -> tuple[list[int], int]:
    """The suffix tree's greedy path, by brute force over every occurrence: the longest suffix
    of the context (NGRAM..depth, on ReplyCache's levels) that occurs in a reply, then the
    continuation most of its occurrences share, newest first on a tie. Replies of 3 tokens or
    fewer are not kept."""
    replies = [r for r in replies if len(r) > 3]
    levels = sorted({depth >> i for i in range(8) if depth >> i > 8} | set(range(3, 9)),
                    reverse=True)
    for length in levels:
        if length > len(context):
            continue
        pattern = context[-length:]
        found = [(r, i + length) for r in reversed(range(len(replies)))
                 for i in reversed(range(len(replies[r]) - length + 1))
                 if replies[r][i:i + length] == pattern]
        if found:
            break
    else:
        return [], 0
    guesses, prob = [], 1.0
    for _ in range(k):  # (spec_factor 10: no cap here)
        nxt = [replies[r][q] if q < len(replies[r]) else None for r, q in found]
        token = max(dict.fromkeys(nxt), key=nxt.count)  # first seen wins a tie
        if token is None:
            break
        prob *= nxt.count(token) / len(found)
        if prob < min_prob:
            break
        guesses.append(token)
        found = [(r, q + 1) for (r, q), t in zip(found, nxt, strict=True) if t == token]
    return guesses, length


def test_the_guess_is_the_continuation_most_matches_share():
    cache = ReplyCache(max_replies=8, max_depth=8)
    cache.add([1, 2, 3, 4, 5, 6])
    cache.add([9, 2, 3, 4, 7, 8])
    cache.add([0, 2, 3, 4, 5, 9])
    # 2 3 4 continues with 5 twice and 7 once; after 2 3 4 5, 6 and 9 tie and the newest wins.
    # The first guess's estimate is Laplace's (2 + 1) / (3 + 2).
    assert cache.lookup([2, 3, 4], 4, 0.1, 10.0) == ([5, 9], pytest.approx(3 / 5), 3)
    # A longer match narrows the candidates to the replies that share it; one match alone is
    # not certain.
    assert cache.lookup([1, 2, 3, 4], 4, 0.1, 10.0) == ([5, 6], pytest.approx(2 / 3), 4)
    # No guess below the minimum estimate: 5 (2/3), then 6 or 9 (1/3 of the way).
    assert cache.lookup([2, 3, 4], 4, 0.4, 10.0)[0] == [5]
    # A guess never runs past the end of a reply into the next one.
    assert cache.lookup([3, 4, 5, 6], 4, 0.1, 10.0)[0] == []
    # Never seen, or too short to look up.
    assert cache.lookup([7, 7, 7], 4, 0.1, 10.0) == ([], 0.0, 0)
    assert cache.lookup([2, 3], 4, 0.1, 10.0) == ([], 0.0, 0)
    # At most spec_factor guesses per matched token.
    assert cache.lookup([2, 3, 4], 4, 0.1, 0.5)[0] == [5]
    # Too short to ever guess anything: not kept.
    cache.add([4, 5, 6])
    assert cache.num_replies == 3


def test_replies_under_a_key_can_be_hidden():
    cache = ReplyCache(max_replies=8, max_depth=8)
    cache.add([1, 2, 3, 4], key=7)
    cache.add([5, 1, 2, 3, 9], key=8)
    assert cache.lookup([1, 2, 3], 2, 0.1, 10.0)[0] == [9]  # the newest
    assert cache.lookup([1, 2, 3], 2, 0.1, 10.0, exclude=8)[0] == [4]
    assert cache.lookup([5, 1, 2, 3], 2, 0.1, 10.0, exclude=8)[0] == [4]
    assert cache.lookup([1, 2, 3], 2, 0.1, 10.0, exclude=None)[0] == [9]


def test_hidden_replies_do_not_use_up_the_candidates():
    cache = ReplyCache(max_replies=100, max_depth=8)
    cache.add([1, 2, 3, 4], key=2)
    for _ in range(MAX_CANDIDATES + 8):  # newer, all hidden from the request below
        cache.add([1, 2, 3, 5], key=1)
    assert cache.lookup([1, 2, 3], 1, 0.1, 10.0, exclude=1)[0] == [4]
    assert cache.lookup([1, 2, 3], 1, 0.1, 10.0)[0] == [5]


@pytest.mark.parametrize("max_replies", [1, 2, 5])
def test_a_small_cache_keeps_the_newest_replies(max_replies):
    cache = ReplyCache(max_replies=max_replies, max_depth=8)
    for i in range(12):
        cache.add([i, 100, 101, 102, 200 + i], key=i)
        assert 1 <= cache.num_replies <= max_replies
        assert cache.lookup([100, 101, 102], 1, 0.0, 10.0)[0] == [200 + i]
        assert cache.keys[-1] == i

def test_lookups_match_a_brute_force_search():
    rng = random.Random(0)
    replies = [[rng.randrange(6) for _ in range(rng.randrange(1, 30))] for _ in range(40)]
    cache = ReplyCache(max_replies=100, max_depth=12)
    for r in replies:
        cache.add(r)
    exact = 0
    for _ in range(300):
        context = [rng.randrange(6) for _ in range(rng.randrange(3, 20))]
        got, _, length = cache.lookup(context, 5, 0.05, 10.0)
        # Only the newest MAX_CANDIDATES entries of the last 3 tokens' hash chain are looked
        # at: the two agree wherever the 3 tokens occur no more often (6 symbols: no chain
        # here holds another 3-gram).
        if sum(r[i:i + 3] == context[-3:] for r in replies
               for i in range(len(r) - 2)) <= MAX_CANDIDATES:
            assert (got, length) == _reference_lookup(replies, context, 5, 0.05, 12), context
            exact += 1
    assert exact > 150


def test_a_full_cache_forgets_its_oldest_replies_and_nothing_else():
    rng = random.Random(1)
    replies = [[rng.randrange(8) for _ in range(rng.randrange(1, 40))] for _ in range(300)]
    bounded = ReplyCache(max_replies=100, max_depth=12)
    for i, r in enumerate(replies):
        bounded.add(r, key=i)
    assert 50 <= bounded.num_replies <= 100
    assert bounded.base > 0  # it has evicted
    fresh = ReplyCache(max_replies=1000, max_depth=12)
    kept = [(i, r) for i, r in enumerate(replies) if len(r) > 3][-bounded.num_replies:]
    for i, r in kept:
        fresh.add(r, key=i)
    # Every look-up reads as in a cache that only ever saw the replies kept.
    for _ in range(300):
        context = [rng.randrange(8) for _ in range(rng.randrange(3, 20))]
        exclude = rng.choice(kept)[0]
        assert bounded.lookup(context, 5, 0.05, 10.0, exclude) == \
            fresh.lookup(context, 5, 0.05, 10.0, exclude)
        assert bounded.lookup(context, 5, 0.05, 10.0) == fresh.lookup(context, 5, 0.05, 10.0)


def test_a_reply_is_found_from_its_first_token_and_its_prompt_never_guessed():
    """A reply is kept behind its prompt's last 2 tokens (a chat template's assistant header):
    a request that has made one token already finds the replies that began with it."""
    cache = ReplyCache(max_replies=8, max_depth=8)
    cache.add([10, 11, 12, 13], lead=[5, 6, 7, 8, 9])
    assert list(cache.tokens) == [8, 9, 10, 11, 12, 13, -1]
    assert cache.lookup([1, 8, 9, 10], 4, 0.1, 10.0)[0] == [11, 12, 13]
    assert cache.lookup([1, 7, 8, 9], 4, 0.1, 10.0)[0] == []  # the prompt's end: no guess
    # Without its prompt a reply's first 3 tokens are needed for a match.
    bare = ReplyCache(max_replies=8, max_depth=8)
    bare.add([10, 11, 12, 13])
    assert bare.lookup([1, 8, 9, 10], 4, 0.1, 10.0)[0] == []
    # A 2-token reply is worth keeping behind its prompt; a 1-token one (a beam search's
    # step) is not.
    cache.add([20, 21], lead=[8, 9])
    cache.add([30], lead=[8, 9])
    assert cache.num_replies == 2 and cache.lookup([8, 9, 20], 1, 0.1, 10.0)[0] == [21]


def test_a_long_reply_is_cached_up_to_a_cap():
    cache = ReplyCache(max_replies=8, max_depth=8)
    cache.add(list(range(MAX_REPLY_TOKENS + 500)), lead=[7, 8])
    assert len(cache.tokens) == 2 + MAX_REPLY_TOKENS + 1
    assert cache.lookup([1, 2, 3], 2, 0.1, 10.0)[0] == [4, 5]


def _colliding_ngrams() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two different NGRAMs that _hash puts in one bucket."""
    seen: dict[int, tuple[int, ...]] = {}
    for a in range(40):
        for b in range(40):
            for c in range(800):
                h = _hash(a, b, c)
                if h in seen:
                    return seen[h], (a, b, c)
                seen[h] = (a, b, c)
    raise AssertionError("no collision")


def test_hash_collisions_do_not_use_up_the_candidates():
    """The candidates are occurrences of the request's own NGRAM: many newer occurrences of
    another NGRAM with the same hash do not hide an older match."""
    mine, other = _colliding_ngrams()
    cache = ReplyCache(max_replies=1000, max_depth=8)
    cache.add([*mine, 4000, 4001])
    for _ in range(2 * MAX_CANDIDATES):
        cache.add([*other, 4002])
    assert cache.lookup(list(mine), 2, 0.1, 10.0)[0] == [4000, 4001]


def test_a_long_copy_from_the_prompt_beats_a_shorter_match_in_the_replies():
    """Prompt lookup stops counting a match at prompt_lookup_max (4): the proposer measures
    the request's own match as far as the replies' before it compares them."""
    proposer = SuffixProposer(SpeculativeConfig(method="suffix"))
    phrase = [50, 51, 52, 53, 54, 55]  # ends the request's context, and occurs in a reply
    proposer.replies.add([*phrase, 90, 91, 92, 93])
    document = [60, 61, 62, 63, 64, 65, 66, 67, 68, 69]
    context = [*document, *phrase, 70, 71, 72, 73, 1, 2, *document, *phrase]
    req = SimpleNamespace(request_id="r")
    # The document and phrase (16 tokens) occurred earlier in the context, then 70 71 72 73.
    assert proposer.guess(req, context, 4) == ([70, 71, 72, 73], 4)
    # A match of the phrase alone in the context (6 tokens) loses to one of 8 in the replies.
    proposer.replies.add([1, 2, 60, 61, *phrase, 95, 96])
    short = [60, 61, *phrase]
    assert proposer.guess(SimpleNamespace(request_id="s"),
                          [*phrase, 70, 71, 9, *short], 2)[0] == [95, 96]


def test_only_a_finished_request_leaves_its_reply():
    proposer = SuffixProposer(SpeculativeConfig(method="suffix"))
    paused = SimpleNamespace(request_id="a", is_finished=False, output_token_ids=[5, 6, 7, 8],
                             prompt_token_ids=[1, 2])
    proposer.free(paused)  # preempted: it resumes and finishes later
    assert proposer.replies.num_replies == 0
    done = SimpleNamespace(request_id="a", is_finished=True, output_token_ids=[5, 6, 7, 8],
                           prompt_token_ids=[1, 2])
    proposer.free(done)
    assert proposer.replies.num_replies == 1
    proposer.reset_prefix_cache()
    assert proposer.replies.num_replies == 0


@pytest.mark.parametrize("bad", [{"suffix_decoding_max_tree_depth": 2},
                                 {"suffix_decoding_max_cached_requests": 0},
                                 {"suffix_decoding_max_spec_factor": 0.0},
                                 {"suffix_decoding_max_spec_factor": float("inf")},
                                 {"suffix_decoding_min_token_prob": 1.5},
                                 # JSON's numbers: each crashed a step or the start-up
                                 {"suffix_decoding_max_cached_requests": 1e4},
                                 {"suffix_decoding_max_tree_depth": 24.0},
                                 {"prompt_lookup_max": 4.0},
                                 {"suffix_decoding_min_token_prob": "0.1"}])
def test_bad_suffix_settings_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SpeculativeConfig.from_dict({"method": "suffix", **bad})


def test_a_repeated_task_is_guessed_from_the_earlier_reply(llm):
    """The second time a prompt comes, its reply is guessed from the first one's, and the
    output is still the target's own (float32, greedy)."""
    prompts = ["Write a haiku about the sea.", "Describe a cat in one sentence."]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    spec = LLM(dtype="float32", speculation_policy="static",
               speculative_config={"method": "suffix", "num_speculative_tokens": 4})
    first = spec.generate(prompts, params)  # together: neither has a reply to learn from yet
    assert [o.outputs[0].token_ids for o in first] == want
    stats = spec.get_stats()
    # Each reply is kept behind its prompt's last 2 tokens.
    assert stats["suffix_cached_replies"] == 2 and stats["suffix_cached_tokens"] == 2 * (2 + 40)

    def accepted_and_drafted() -> tuple[int, int]:
        before = spec.get_stats()
        again = spec.generate(prompts[::-1], params)
        assert [o.outputs[0].token_ids for o in again] == want[::-1]
        after = spec.get_stats()
        return (after["num_accepted_tokens"] - before["num_accepted_tokens"],
                after["num_draft_tokens"] - before["num_draft_tokens"])

    accepted, drafted = accepted_and_drafted()
    assert drafted >= 60 and accepted >= 0.8 * drafted, (accepted, drafted)
    assert any(level > GLOBAL_LEVEL for level in spec.get_stats()["spec_evidence_acceptance"])
    # A benchmark's reset forgets the replies: the same prompts are then guessed from their
    # own text alone, as prompt lookup guesses them, and far less of them is right.
    spec.engine.reset_prefix_cache()
    assert spec.engine.proposer.replies.num_replies == 0
    own_text, _ = accepted_and_drafted()
    assert accepted > 2 * own_text, (accepted, own_text)


def test_a_benchmark_never_guesses_a_prompt_from_its_own_earlier_reply(llm):
    """The lab's runs are greedy and cycle through a workload's prompts: with suffix decoding a
    request is not guessed from the replies to its own prompt, and a run starts with no
    replies (nor the last run's)."""
    from specserve.bench.lab import prepare_workload, run_workload
    from specserve.bench.workloads import load_workload

    spec = LLM(dtype="float32", speculation_policy="static",
               speculative_config={"method": "suffix", "num_speculative_tokens": 2})
    proposer = spec.engine.proposer
    workload = prepare_workload(spec.engine, "json", load_workload("json")[:1], cap=16)
    prompt = workload.prompts[0]
    proposer.replies.add(spec.generate([prompt], SamplingParams(
        temperature=0, max_tokens=16))[0].outputs[0].token_ids)  # left over from before
    for _ in range(2):
        run = run_workload(spec.engine, workload, 1, 4, reset_prefix_cache=False)
        assert run["num_prompts"] == 4 and len(run["requests"]) == 4
        assert proposer.replies.num_replies == 4  # this run's, not the last run's
        assert proposer.exclude_same_prompt is False
    # The only replies were to the same prompt: not one guess came from them.
    levels = spec.get_stats()["spec_evidence_acceptance"]
    assert levels and max(levels) < GLOBAL_LEVEL, levels


def test_an_aborted_request_leaves_its_reply_and_a_running_one_none(llm):
    spec = LLM(dtype="float32", speculation_policy="static",
               speculative_config={"method": "suffix", "num_speculative_tokens": 2})
    engine = spec.engine
    req = engine.add_request("Write a haiku about the sea.", SamplingParams(
        temperature=0, max_tokens=50, ignore_eos=True))
    for _ in range(8):
        engine.step()
    assert engine.proposer.replies.num_replies == 0
    engine.abort_request(req.request_id)  # its client went away: the target still wrote it
    assert engine.proposer.replies.num_replies == 1
    assert list(engine.proposer.replies.tokens) == \
        req.prompt_token_ids[-2:] + req.output_token_ids + [-1]


def test_switching_to_adaptive_keeps_the_replies():
    """The first switch to the adaptive policy profiles the model and forgets the prefix cache
    its profile dirtied; the cached replies are no garbage and stay."""
    spec = LLM(dtype="float32", speculation_policy="static",
               speculative_config={"method": "suffix", "num_speculative_tokens": 2})
    spec.engine.proposer.replies.add([5, 6, 7, 8])
    spec.engine.set_speculation_policy("adaptive")
    assert spec.engine.proposer.replies.num_replies == 1
