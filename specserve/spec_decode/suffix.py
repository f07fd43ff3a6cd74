"""Suffix decoding (Oliaro et al. 2024, "SuffixDecoding: Extreme Speculative Decoding for
Emerging AI Applications"; vLLM's `suffix` method): guesses taken from the replies of earlier
requests as well as from the request's own context.

Agent loops, extraction into a fixed schema and text-to-SQL send many requests whose replies
repeat each other's phrasing, and prompt lookup (ngram.py) sees only the request's own tokens.
This proposer also keeps the replies of the last finished requests and looks up where the
request's latest tokens occurred in them. Of those occurrences that share the longest suffix
found, it follows the continuation most of them agree on, token by token, for as long as the
share that agrees (the estimate that the guess is right) stays at or above `min_token_prob`.

That is the greedy path through the paper's suffix tree and its frequency estimate, without a
tree: a tree over every suffix of a million cached tokens is millions of Python objects. The
replies lie in one token array, and each position is chained to the previous one whose last
NGRAM tokens hash alike, as zlib chains its match candidates. The index costs 12 bytes per
cached token and a fixed 8 MiB table.

The request's own context is looked up as prompt lookup does it, and a match there at least as
long as the replies' wins (both measured up to the tree's depth).

Each reply is cached behind the last NGRAM - 1 tokens of its prompt (a chat template's
`assistant` header), so a reply's first token already finds the replies that began alike, as
the paper's tree matches from the first generated token. The prompt's tokens are only matched,
never guessed.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections import Counter

from specserve.engine.request import Request
from specserve.spec_decode.config import SpeculativeConfig
from specserve.spec_decode.ngram import NgramProposer

# A candidate occurrence shares at least the request's last NGRAM tokens (3: _hash's arity).
NGRAM = 3
HASH_BITS = 20
_MASK = (1 << HASH_BITS) - 1
_MULT = (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D)  # one odd multiplier per n-gram position
SEPARATOR = -1  # ends every reply: no match or guess runs from one reply into the next
# Occurrences looked at per guess, newest first: bounds a look-up's time where a common n-gram
# occurred thousands of times.
MAX_CANDIDATES = 32
# A reply is cached up to this many tokens: bounds the cache's host memory (12 bytes a token,
# up to ~0.5 GB at the default 10,000 replies) and the engine thread's time to index one reply
# (a Python loop, ~1 us a token), whatever max_model_len allows; a guess follows a match only
# a few tokens on.
MAX_REPLY_TOKENS = 4096
# A guess from the shared replies is reported as evidence level GLOBAL_LEVEL + its estimate in
# tenths (rounded up), apart from prompt lookup's levels (its match lengths): the acceptance
# tracker then learns how often each estimate is right on this workload.
GLOBAL_LEVEL = 1000


def _hash(a: int, b: int, c: int) -> int:
    return (a * _MULT[0] ^ b * _MULT[1] ^ c * _MULT[2]) & _MASK


class ReplyCache:
    """The replies of the last `max_replies` finished requests, and where each NGRAM occurred
    in them."""

    def __init__(self, max_replies: int, max_depth: int):
        if max_depth < NGRAM:
            raise ValueError(f"the suffix tree's depth must be at least {NGRAM}")
        self.max_replies, self.max_depth = max_replies, max_depth
        # Match lengths a candidate is measured at, longest first: halving down to 8, then
        # each length to NGRAM (a few slice comparisons, in C, not a token-by-token walk). A
        # match is counted at the longest level it reaches.
        self.levels = sorted({max_depth >> i for i in range(8) if max_depth >> i > 8}
                             | set(range(NGRAM, min(8, max_depth) + 1)), reverse=True)
        self.clear()

    def clear(self) -> None:
        # Positions are absolute and only grow: evicting the oldest replies cuts the front of
        # the arrays and raises `base`, and a chain link or table entry below `base` ends the
        # chain. Nothing is re-indexed.
        self.base = 0  # the position of tokens[0]
        self.tokens = array("i")
        self.prev = array("q")  # prev[p - base]: the latest earlier position with p's hash
        self.head = array("q", [-1]) * (1 << HASH_BITS)  # hash -> latest position
        self.starts: list[int] = []  # where each cached reply begins, oldest first
        self.keys: list[int | None] = []  # each reply's key (its prompt's hash), if given

    @property
    def num_replies(self) -> int:
        return len(self.starts)

    def add(self, reply: list[int], key: int | None = None, lead: list[int] | None = None) -> None:
        """Cache a reply behind the last NGRAM - 1 tokens of `lead` (its prompt); `key` names
        the prompt, for lookups that must not see it."""
        lead = lead[-(NGRAM - 1):] if lead and reply else []
        reply = reply[:MAX_REPLY_TOKENS]
        if len(lead) + len(reply) <= NGRAM:
            return  # no NGRAM in it is ever followed by a token: it can guess nothing
        if len(self.starts) >= self.max_replies:
            self._drop_oldest(len(self.starts) - self.max_replies // 2)
        tokens, prev, head = self.tokens, self.prev, self.head
        j = len(tokens)  # the first index of the lead and reply
        self.starts.append(self.base + j)
        self.keys.append(key)
        tokens.extend(lead)
        tokens.extend(reply)
        tokens.append(SEPARATOR)
        # The first tokens end no NGRAM of their own; with at most NGRAM - 1 tokens of lead,
        # every NGRAM indexed ends in the reply, so only reply tokens follow one.
        prev.extend([-1] * (NGRAM - 1))
        for i in range(j + NGRAM - 1, len(tokens) - 1):
            h = _hash(tokens[i - 2], tokens[i - 1], tokens[i])
            prev.append(head[h])
            head[h] = self.base + i
        prev.append(-1)

    def _drop_oldest(self, n: int) -> None:
        """Forget the n oldest replies: a cut of the arrays' front (a memmove). The cache
        shrinks in batches (to half its capacity), so that a full cache does not move its
        arrays at every finished request."""
        end = self.starts[n] if n < len(self.starts) else self.base + len(self.tokens)
        del self.tokens[:end - self.base]
        del self.prev[:end - self.base]
        del self.starts[:n]
        del self.keys[:n]
        self.base = end

    def lookup(self, context: list[int], k: int, min_prob: float, spec_factor: float,
               exclude: int | None = None) -> tuple[list[int], float, int]:
        """(guesses, the estimate for the first, the match length they follow); ([], 0, 0)
        when the request's last NGRAM tokens were never seen. At most spec_factor x the match
        length guesses are made, none once most matches end their reply, and none whose
        estimate falls below min_prob (so a match may still give no guess). The estimate
        is the share of the matches that go on with the guess; the first one's is returned
        as (agreeing + 1) / (matches + 2) (Laplace's rule), so that one old match does not
        read as certain. Replies added with the key `exclude` are not looked at."""
        if len(context) < NGRAM or k <= 0 or not self.starts:
            return [], 0.0, 0
        tokens, prev, base = self.tokens, self.prev, self.base
        tail = array("i", context[-self.max_depth:])
        span = len(tail)
        best, found = 0, []  # found: the index after each longest match

        def matches(i: int, length: int) -> bool:  # (the hash collides: compare the tokens)
            return length <= span and i + 1 >= length and \
                tokens[i + 1 - length:i + 1] == tail[span - length:]

        p = self.head[_hash(tail[-3], tail[-2], tail[-1])]
        looked = links = 0
        # Hidden replies and hash collisions do not use up the candidates (a cache without them
        # would look past them), but the walk is bounded all the same.
        while p >= base and looked < MAX_CANDIDATES and links < 4 * MAX_CANDIDATES:
            links += 1
            i = p - base
            if not matches(i, NGRAM) or (  # another NGRAM with the same hash
                    exclude is not None
                    and self.keys[bisect_right(self.starts, p) - 1] == exclude):
                p = prev[i]
                continue
            looked += 1
            # One comparison rules out an occurrence shorter than the best so far.
            if not best or matches(i, best):
                length = next((n for n in self.levels if n >= max(best, NGRAM)
                               and matches(i, n)), 0)
                if length > best:
                    best, found = length, [i + 1]
                elif length and length == best:
                    found.append(i + 1)
            p = prev[i]
        if not found:
            return [], 0.0, 0
        k = min(k, max(1, math.floor(spec_factor * best)))
        guesses: list[int] = []
        prob, first = 1.0, 0.0
        for _ in range(k):
            token, agree = Counter(tokens[q] for q in found).most_common(1)[0]
            if token == SEPARATOR:
                break  # most of them end their reply here
            if not guesses:
                first = (agree + 1) / (len(found) + 2)
            prob *= agree / len(found)
            if prob < min_prob:
                break
            guesses.append(token)
            found = [q + 1 for q in found if tokens[q] == token]
        return guesses, first, best


def _match_length(context: list[int], start: int, n: int, limit: int) -> int:
    """How far (up to limit) the tokens before context[start] match the context's last ones,
    given that the last n do: prompt lookup stops counting at prompt_lookup_max, the replies'
    lookup at the tree's depth."""
    if not n:
        return 0
    total = len(context)
    while n < min(limit, start) and context[start - 1 - n] == context[total - 1 - n]:
        n += 1
    return n


class SuffixProposer(NgramProposer):
    """Prompt lookup (its per-request indexes and look-ups) plus the cached replies."""

    name = "suffix"
    learns_from_replies = True

    def __init__(self, spec: SpeculativeConfig):
        super().__init__(spec.prompt_lookup_min, spec.prompt_lookup_max)
        self.replies = ReplyCache(spec.suffix_decoding_max_cached_requests,
                                  spec.suffix_decoding_max_tree_depth)
        self.min_prob = spec.suffix_decoding_min_token_prob
        self.spec_factor = spec.suffix_decoding_max_spec_factor
        # Set by a benchmark that sends a workload's prompts more than once: a request is not
        # guessed from the replies to its own prompt (greedy, they are its own reply).
        self.exclude_same_prompt = False
        self.prompt_keys: dict[str, int] = {}

    @property
    def num_cached_replies(self) -> int:
        return self.replies.num_replies

    @property
    def num_cached_tokens(self) -> int:
        """The replies' tokens and their prompts' last tokens (less the separators)."""
        return len(self.replies.tokens) - self.replies.num_replies

    def guess(self, req: Request, context: list[int], k: int) -> tuple[list[int], int]:
        """The guesses of the longer match: the cached replies' (evidence: GLOBAL_LEVEL +
        ceil(10 x the first guess's estimate)) where theirs is longer than the request's own
        context's, else prompt lookup's (evidence: its match length, up to
        prompt_lookup_max)."""
        start, n = self.index(req).find(context)
        exclude = self._prompt_key(req) if self.exclude_same_prompt else None
        shared, first, m = self.replies.lookup(context, k, self.min_prob, self.spec_factor,
                                               exclude)
        if shared and m > _match_length(context, start, n, self.replies.max_depth):
            return shared, GLOBAL_LEVEL + math.ceil(10 * first)
        return (context[start:start + k], n) if n else ([], 0)

    def free(self, req: Request) -> None:
        """A finished request's reply joins the cache (an aborted one's too: the target wrote
        it); one that is only paused (preempted, past the context) keeps its tokens."""
        if req.is_finished:
            self.replies.add(req.output_token_ids,
                             self._prompt_key(req) if self.exclude_same_prompt else None,
                             lead=req.prompt_token_ids)
        super().free(req)
        self.prompt_keys.pop(req.request_id, None)

    def _prompt_key(self, req: Request) -> int:
        key = self.prompt_keys.get(req.request_id)
        if key is None:
            key = self.prompt_keys[req.request_id] = hash(tuple(req.prompt_token_ids))
        return key

    def reset_prefix_cache(self) -> None:
        """What earlier requests left behind goes with the prefix cache: a benchmark that
        resets the one between runs does not measure replies it has already seen."""
        self.replies.clear()

