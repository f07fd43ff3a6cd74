"""EAGLE proposer: an EAGLE head (eagle_head.py) run inside the continuous batch from the
features the target already computed.

After every target forward the engine hands over the step's features and, per request, where
the rows of its positions that stayed valid are (prefill chunks, decodes, and verified tokens up
to the last accepted one). A windowed head keeps its last window + 2 small steps whole
(StepFeatures) and a request copies its rows into its own small buffer only when it next
drafts, so a step that drafts nothing costs no per-request work; a large step, or any step of a
windowless head, is handed out at once. Proposing K tokens is K
batched head forwards: the first catches up on every position since the head last ran with real
features (the prompt at first, the accepted tokens since, or a long stretch after speculation
was off) and guesses one token; the next K - 1 feed back the head's own predicted feature and
guess. The chained positions are recomputed from the target's real features next time, so the
head's KV cache only ever keeps positions built from real features.
"""

from __future__ import annotations

import sys
import time
from collections import deque

import torch

from specserve.engine.model_runner import kv_bytes_per_token
from specserve.engine.request import Request
from specserve.layers.linear import PackedLinear, pack_linears
from specserve.quant.swap import model_nbytes
from specserve.spec_decode.draft_head import draft_tokens
from specserve.spec_decode.eagle_head import aux_feature
from specserve.spec_decode.eagle_io import load_eagle
from specserve.spec_decode.model_proposer import (
    CATCH_UP_CHUNK,
    ModelProposer,
    ProposerSeq,
    stack_probs,
)
from specserve.spec_decode.proposer import Proposal

# Target features kept per request until the head reads them (a long prompt arrives in several
# prefill chunks; a request may go a long stretch without speculating). Older positions are read
# as zeros. 2048 rows of a 576-wide bf16 model: 2.4 MB per request at most. A head with a context
# window needs only the last window + 2 (its longest catch-up without a restart).
MAX_PENDING_FEATURES = 2048
# Steps of at most this many tokens are kept whole, as recent steps (StepFeatures), and a
# windowed head's requests read their rows from them as views: a window of 64 keeps up to 66
# such steps alive, ~30 MB at the most for SmolLM2's three 576-wide bf16 features. Larger steps
# (prefill) hand each request a copy of its rows at once.
VIEW_ROWS = 128


def window_catch_up(behind: int, window: int | None) -> int:
    """Positions a head `behind` positions behind runs over to catch up (EagleSeq)."""
    return behind if window is None else min(behind, window + 2)


class TokenWindow:
    """A request's token ids from `offset` on, as the head's positions number them (what
    ModelRunner.prepare reads: len() and slices), without copying the list."""

    __slots__ = ("ids", "offset")

    def __init__(self, ids: list[int], offset: int):
        self.ids, self.offset = ids, offset

    def __len__(self) -> int:
        return len(self.ids) - self.offset

    def __getitem__(self, s: slice) -> list[int]:
        return self.ids[s.start + self.offset:s.stop + self.offset]


class EagleSeq(ProposerSeq):
    """The head's view of one request (model_proposer.ProposerSeq) plus the target features not
    yet consumed; num_computed_tokens counts head KV positions including this proposal's chain,
    num_real those built from the target's real features.

    A head trained over a window of the context (eagle_head.EagleHead.context) is served the
    same window: when it is further behind than that (a new prompt, a long stretch without
    speculation), it starts over at `offset`, `window` positions before the last one the target
    computed (its position 0 is the request's position `offset` and reads a zero feature, as
    in training). So a catch-up never runs over more than window + 2 positions, and features
    older than the last window + 2 are never read. The head's context then grows with the
    reply, as it did in training."""

    seed_salt = 0xEA61E

    def __init__(self, req: Request, window: int | None = None):
        super().__init__(req)
        self.window = window
        self.offset = 0  # the request's position of head position 0
        self.num_real = 0
        self.chunks: list[tuple[int, torch.Tensor]] = []  # (first position, [n, hidden])
        self.num_pending = 0  # rows in chunks
        # The longest catch-up without a restart (window + 2 positions) reads window + 2 rows.
        self.max_pending = MAX_PENDING_FEATURES if window is None else window + 2
        self.synced = 0  # the proposer's steps up to this one are in chunks (EagleProposer._sync)

    @property
    def all_token_ids(self) -> list[int] | TokenWindow:
        ids = self.req.all_token_ids
        return TokenWindow(ids, self.offset) if self.offset else ids

    @property
    def num_tokens(self) -> int:
        return len(self.req.all_token_ids) - self.offset

    def catch_up(self) -> int:
        """Positions the next proposal's first head forward runs over."""
        return window_catch_up(self.num_tokens - self.num_real, self.window)

    def restart_if_behind(self) -> bool:
        """Start over on the window when the head is further behind; True when it did (the
        caller frees the head's blocks: their KV is of the old positions)."""
        if self.catch_up() == self.num_tokens - self.num_real:
            return False  # the catch-up covers everything behind
        # the last known token's K/V is not computed yet: the target's last is the one before
        self.offset = len(self.req.all_token_ids) - 2 - self.window
        self.num_real = self.num_computed_tokens = 0
        return True

    def add_features(self, first: int, rows: torch.Tensor) -> None:
        if self.chunks and self.chunks[-1][0] + len(self.chunks[-1][1]) > first:
            # Rows again for positions it holds (a preempted request's tail, computed again
            # when it came back): the new ones replace them, counted once.
            self.chunks = [(s, r[:first - s]) for s, r in self.chunks if s < first]
            self.num_pending = sum(len(r) for _, r in self.chunks)
        self.chunks.append((first, rows))
        self.num_pending += len(rows)
        excess = self.num_pending - self.max_pending
        while excess > 0:  # trim the oldest rows, not whole chunks
            start, oldest = self.chunks[0]
            if len(oldest) <= excess:
                self.chunks.pop(0)
                cut = len(oldest)
            else:
                self.chunks[0] = (start + excess, oldest[excess:])
                cut = excess
            self.num_pending -= cut
            excess -= cut

    def add_latest(self, first: int, rows: torch.Tensor, copy: bool = False) -> None:
        """add_features for the rows it would keep (the last max_pending), copied if asked."""
        skip = max(len(rows) - self.max_pending, 0)
        rows = rows[skip:]
        self.add_features(first + skip, rows.clone() if copy else rows)

    def features(self, first: int, n: int, width: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> torch.Tensor:
        """The features head positions first .. first + n - 1 read: the target's at the same
        positions of the request (zeros where none was kept, and before head position 0)."""
        first += self.offset
        out = torch.zeros(n, width, dtype=dtype, device=device)
        for start, rows in self.chunks:
            lo, hi = max(start, first, self.offset), min(start + len(rows), first + n)
            if lo < hi:
                out[lo - first:hi - first] = rows[lo - start:hi - start]
        return out

    def drop_features_before(self, position: int) -> None:
        """Drop the features of head positions before `position`."""
        position += self.offset
        self.chunks = [(max(s, position), r[max(position - s, 0):]) for s, r in self.chunks
                       if s + len(r) > position]
        self.num_pending = sum(len(r) for _, r in self.chunks)


class StepFeatures:
    """One target step's features, kept whole until the requests that were in it read their
    rows: handing each request its rows at every step cost ~6 us per request, ~0.3 ms per step
    at concurrency 32, also while the policy drafted nothing (docs/performance.md, session 29).
    The fused layers' streams are RMS-normalised on the first read."""

    __slots__ = ("hidden", "index", "number", "ready", "width")

    def __init__(self, number: int, hidden: torch.Tensor, width: int,
                 index: dict[str, tuple[int, int, int]]):
        self.number, self.hidden, self.width, self.index = number, hidden, width, index
        self.ready = False

    def rows(self) -> torch.Tensor:
        if not self.ready:
            normalise_streams(self.hidden, self.width)
            self.ready = True
        return self.hidden


def normalise_streams(hidden: torch.Tensor, width: int) -> torch.Tensor:
    """The final hidden states followed by the residual streams after the head's feature
    layers -> feature rows (eagle_head.aux_feature normalises each stream), in place."""
    if hidden.shape[-1] > width:
        hidden[:, width:] = aux_feature(hidden[:, width:].unflatten(-1, (-1, width))).flatten(-2)
    return hidden


class EagleProposer(ModelProposer):
    name = "eagle"
    needs_hidden = True

    def __init__(self, path: str, target_cfg, embed_tokens, head_weight: torch.Tensor,
                 tokenizer, dtype: torch.dtype, block_size: int,
                 kv_cache_memory: int | None = None):
        super().__init__()
        # The EAGLE head: the network whose KV cache the proposer's pool holds.
        self.model = load_eagle(path, target_cfg, embed_tokens, head_weight, dtype, tokenizer)
        self.model_config = self.model.cfg
        self.aux_layers = self.model.feature_layers  # the engine's target forwards return them
        own = model_nbytes(self.model)  # fc, the layer, and the LM head rows it keeps
        shared_head = self.model.head_ids is None  # the full LM head is the target's tensor
        if shared_head:
            own -= self.model.lm_head.weight.nbytes
        pack_linears(self.model)
        head = self.model.lm_head
        if shared_head and not isinstance(head, torch.nn.Linear):
            own += head.weight_nbytes  # packing made the head a copy after all
        # Packing re-lays a weight in place of the one counted above, but the AMX kernel's copy
        # (layers/linear.py) is held beside it.
        own += sum(m.weight_amx.nbytes for m in self.model.modules()
                   if isinstance(m, PackedLinear) and not (shared_head and m is head))
        self.weight_bytes = own
        self.dtype = dtype
        self.block_size = block_size
        self.kv_bytes_per_token = kv_bytes_per_token(self.model_config, dtype)
        self.kv_cache_memory = kv_cache_memory
        # A windowed head's recent steps (StepFeatures), oldest first: enough for every
        # request scheduled in each of them to find its last window + 2 positions.
        window = self.model.context
        self.steps: deque[StepFeatures] | None = (deque(maxlen=window + 2)
                                                  if window is not None else None)
        self.num_steps = 0
        self.catch_up_chunk: int | None = None  # None: decided by the attention path

    def on_target_hidden(self, hidden: torch.Tensor,
                         rows: list[tuple[Request, int, int, int]]) -> None:
        """Keep a small step whole for its requests to read when they next draft (sync);
        hand each request its rows of a large one, or of any step for a windowless head, which
        may read 2048 positions back."""
        self.num_steps += 1
        width = self.model_config.hidden_size
        if self.steps is not None and hidden.shape[0] <= VIEW_ROWS:
            index = {}
            for req, first, start, n in rows:
                self._seq(req)  # a new request's seq starts at this step
                index[req.request_id] = (first, start, n)
            self.steps.append(StepFeatures(self.num_steps, hidden, width, index))
            return
        feats = normalise_streams(hidden, width)
        for req, first, start, n in rows:
            seq = self._seq(req)
            self._sync(seq)
            seq.add_latest(first, feats[start:start + n], copy=True)

    def _sync(self, seq: EagleSeq) -> None:
        """Give seq its rows of the kept steps it has not read yet."""
        if seq.synced < self.num_steps and self.steps:
            rid = seq.req.request_id
            for step in self.steps:
                entry = step.index.get(rid) if step.number > seq.synced else None
                if entry is not None:
                    first, start, n = entry
                    seq.add_latest(first, step.rows()[start:start + n])
        seq.synced = self.num_steps

    def propose(self, reqs: list[Request], num_tokens: list[int]) -> Proposal:
        t0 = time.perf_counter()
        width = self.model.feature_size  # a feature row: the final feature, then any layers'
        proposals: list[list[int]] = [[] for _ in reqs]
        prob_rows: list[list[torch.Tensor]] = [[] for _ in reqs]
        need_probs = any(not r.params.is_greedy for r, k in zip(reqs, num_tokens, strict=True)
                         if k)
        alive = [i for i, k in enumerate(num_tokens) if k > 0]
        seqs = {i: self._seq(reqs[i]) for i in alive}
        prev: dict[int, torch.Tensor] = {}  # the head's last predicted feature per request
        for i in alive:
            self._sync(seqs[i])
            if seqs[i].restart_if_behind():
                self.block_manager.free(seqs[i])
            seqs[i].spec_token_ids = []
            seqs[i].num_computed_tokens = seqs[i].num_real
        # A long catch-up (a new prompt, for a head without a window) runs in chunks where
        # attention materialises its scores, as a draft model's does; a request guesses after
        # its last chunk.
        chunk = self.catch_up_chunk or (sys.maxsize if self.runner.use_kernel
                                        else CATCH_UP_CHUNK)
        while alive:
            batch, feats, batch_ids = [], [], []
            for i in list(alive):
                seq = seqs[i]
                behind = seq.num_tokens - seq.num_computed_tokens  # > 0: still catching up
                n = min(behind, chunk) if behind > 0 else \
                    seq.num_tokens + len(seq.spec_token_ids) - seq.num_computed_tokens
                if not self.block_manager.allocate(seq, n):
                    alive.remove(i)  # the head's pool is full: this request guesses no further
                    continue
                batch.append((seq, n))
                batch_ids.append(i)
                if behind > 0:  # catch up: position j reads the target's feature j - 1
                    feats.append(seq.features(seq.num_computed_tokens - 1, n, width, self.dtype,
                                              self.runner.device))
                else:
                    feats.append(prev[i])
            if not batch:
                break
            inputs = self.runner.prepare(batch)
            features = torch.zeros(len(inputs.input_ids), width, dtype=self.dtype,
                                   device=self.runner.device)
            for j, (_, n) in enumerate(batch):
                # A chained guess has the head's own final feature; its layer slots stay 0.
                features[inputs.query_start[j]:inputs.query_start[j] + n,
                         :feats[j].shape[-1]] = feats[j]
            last = torch.tensor([inputs.query_start[j] + n - 1 for j, (_, n) in enumerate(batch)])
            hidden, logits = self.runner.execute(inputs, last, features)
            out = hidden.index_select(0, last.to(hidden.device))  # [len(batch), hidden]
            self.num_forwards += 1
            self.num_tokens_computed += sum(n for _, n in batch)
            self.last_forwards.append((sum(n for _, n in batch), len(batch),
                                       [(seq.num_computed_tokens, n) for seq, n in batch]))
            for seq, n in batch:
                real = seq.num_computed_tokens < seq.num_tokens
                seq.num_computed_tokens += n
                if real:  # real-feature positions: kept across proposals
                    seq.num_real = seq.num_computed_tokens
                    seq.drop_features_before(seq.num_real - 1)
            ready = [j for j, (seq, _) in enumerate(batch)
                     if seq.num_computed_tokens >= seq.num_tokens]
            guessing = [batch_ids[j] for j in ready]
            if guessing:
                tokens, probs = draft_tokens(logits[ready],
                                             [seqs[i].req.params for i in guessing],
                                             [seqs[i].generator for i in guessing],
                                             self.model.head_ids, self.model_config.vocab_size,
                                             need_probs)
                for k, (j, i, token) in enumerate(zip(ready, guessing, tokens.tolist(),
                                                      strict=True)):
                    proposals[i].append(token)
                    seqs[i].spec_token_ids.append(token)
                    prev[i] = out[j:j + 1]
                    if need_probs:
                        prob_rows[i].append(probs[k])
            alive = [i for i in batch_ids if len(proposals[i]) < num_tokens[i]]
        for seq in seqs.values():  # the chain's KV is rebuilt from real features next time
            seq.num_computed_tokens = seq.num_real
        self.time += time.perf_counter() - t0
        return Proposal(proposals, stack_probs(prob_rows, need_probs))

    def on_preempted(self, req: Request) -> None:
        """Keep what the head computed over req's tokens, which do not change: readmitted with
        its prefix mostly cached, req gets only its tail's features again, and a head started
        anew would read zeros over the rest of its window for the rest of the request. Its KV
        blocks stay held while req waits (the head's own pool: a full one only stops guesses)."""
        seq = self.seqs.get(req.request_id)
        if seq is not None:
            self._sync(seq)  # the steps it has not read may leave the kept ones while it waits

    def _new_seq(self, req: Request) -> EagleSeq:
        seq = EagleSeq(req, self.model.context)
        # Steps before this one are of an earlier life of the request (before a preemption):
        # its prefill is computed again.
        seq.synced = self.num_steps - 1
        return seq

    def catch_up_tokens(self, req: Request) -> int:
        seq = self.seqs.get(req.request_id)
        return seq.catch_up() if seq else window_catch_up(req.num_tokens, self.model.context)

    def on_verified(self, req: Request, num_draft: int, num_accepted: int) -> None:
        seq = self.seqs.get(req.request_id)
        if seq is not None:
            seq.spec_token_ids = []
