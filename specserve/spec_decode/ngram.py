"""Prompt lookup (n-gram) proposer (Saxena 2023, "Prompt Lookup Decoding").

Match the last n tokens of the request (n from prompt_lookup_max down to prompt_lookup_min)
against everything earlier in its prompt and output; propose the tokens that followed the most
recent match. No model, near-zero cost; strong where outputs copy their input (RAG, extraction,
code edits, JSON that repeats keys).
"""

from __future__ import annotations

import numpy as np

from specserve.engine.request import Request
from specserve.spec_decode.proposer import Proposal, Proposer


def ngram_lookup(tokens: np.ndarray, k: int, n_min: int, n_max: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest matching
    suffix n-gram (n_max >= n >= n_min). tokens: [num_tokens] int."""
    total = len(tokens)
    for n in range(min(n_max, total - 1), n_min - 1, -1):
        suffix = tokens[total - n:]
        # Windows starting at 0..total-n-1 (the suffix itself excluded).
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:total - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return tokens[start:start + k].tolist()
    return []


class NgramProposer(Proposer):
    name = "ngram"

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int):
        super().__init__()
        self.n_min, self.n_max = prompt_lookup_min, prompt_lookup_max

    def propose(self, reqs: list[Request], num_tokens: list[int]) -> Proposal:
        out = []
        for req, k in zip(reqs, num_tokens, strict=True):
            tokens = np.asarray(req.all_token_ids)
            out.append(ngram_lookup(tokens, k, self.n_min, self.n_max) if k else [])
        return Proposal(out)
