"""Prompt lookup (n-gram) proposer (Saxena 2023, "Prompt Lookup Decoding").

Match the last n tokens of the request (n from prompt_lookup_max down to prompt_lookup_min)
against everything earlier in its prompt and output; propose the tokens that followed the most
recent match. No model, near-zero cost; strong where outputs copy their input (RAG, extraction,
code edits, JSON that repeats keys).
"""

from __future__ import annotations

from array import array

from specserve.engine.request import Request
from specserve.spec_decode.proposer import Proposal, Proposer


class NgramIndex:
    """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix
    n-gram (n_max >= n >= n_min). The history is kept as packed int32 bytes, extended as tokens
    are appended (a request's tokens only grow), and a lookup is one reverse byte search
    (`bytearray.rfind`, in C) per n, keeping only hits on token boundaries. Until session 29 a
    dict of every n-gram was kept instead: building it for a new 2,500-token rag prompt took
    ~1 ms, and at concurrency 64, where a new rag request arrives nearly every step, look-ups
    cost adaptive ~1.3 ms of a 65 ms step while it drafted nothing. Packing a prompt takes
    ~20 us, and a look-up over a few thousand tokens a few us."""

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max
        self.history = bytearray()  # the tokens looked up so far, int32 each

    def lookup(self, tokens: list[int], k: int) -> tuple[list[int], int]:
        """(the guesses, the length of the match they follow); ([], 0) for no match."""
        start, n = self.find(tokens)
        return (tokens[start:start + k], n) if n else ([], 0)

    def find(self, tokens: list[int]) -> tuple[int, int]:
        """(the index after the match, its length n); (0, 0) for no match."""
        total = len(tokens)
        known = len(self.history) // 4
        if known < total:
            self.history += array("i", tokens[known:total]).tobytes()
        history = self.history
        end = 4 * (total - 1)  # occurrences end before the last token: the suffix is excluded
        for n in range(min(self.n_max, total - 1), self.n_min - 1, -1):
            suffix = history[4 * (total - n):4 * total]
            stop = end
            while (pos := history.rfind(suffix, 0, stop)) >= 0:
                if pos % 4 == 0:  # a whole-token match, not bytes straddling two tokens
                    return pos // 4 + n, n
                stop = pos + len(suffix) - 1  # look again, before this one
        return 0, 0


class NgramProposer(Proposer):
    name = "ngram"
    free_lookahead = True

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int):
        super().__init__()
        self.n_min, self.n_max = prompt_lookup_min, prompt_lookup_max
        self.indexes: dict[str, NgramIndex] = {}

    def propose(self, reqs: list[Request], num_tokens: list[int]) -> Proposal:
        """The guesses, with what each rests on as its evidence: a guess that follows a longer
        match is accepted far more often (acceptance.py)."""
        out, evidence = [], []
        for req, k in zip(reqs, num_tokens, strict=True):
            tokens, e = self.guess(req, req.all_token_ids, k) if k else ([], 0)
            out.append(tokens)
            evidence.append(e)
        return Proposal(out, evidence=evidence)

    def guess(self, req: Request, context: list[int], k: int) -> tuple[list[int], int]:
        """Up to k guesses for req and their evidence level (here the match length)."""
        return self.index(req).lookup(context, k)

    def index(self, req: Request) -> NgramIndex:
        index = self.indexes.get(req.request_id)
        if index is None:
            index = self.indexes[req.request_id] = NgramIndex(self.n_min, self.n_max)
        return index

    def free(self, req: Request) -> None:
        self.indexes.pop(req.request_id, None)
