"""EAGLE proposer: an EAGLE head (eagle_head.py) run inside the continuous batch from the
features the target already computed.

After every target forward the engine hands over, per request, the features of the positions
that stayed valid (prefill chunks, decodes, and verified tokens up to the last accepted one).
They wait in a small per-request buffer until the head next runs. Proposing K tokens is K
batched head forwards: the first catches up on every position since the head last ran with real
features (the prompt at first, the accepted tokens since, or a long stretch after speculation
was off) and guesses one token; the next K - 1 feed back the head's own predicted feature and
guess. The chained positions are recomputed from the target's real features next time, so the
head's KV cache only ever keeps positions built from real features.
"""

from __future__ import annotations

import time

import torch

from specserve.config import CacheConfig
from specserve.engine.block_manager import BlockManager
from specserve.engine.model_runner import ModelRunner, kv_bytes_per_token
from specserve.engine.request import Request
from specserve.layers.linear import pack_linears
from specserve.quant.swap import model_nbytes
from specserve.spec_decode.draft_head import draft_tokens
from specserve.spec_decode.eagle_io import load_eagle
from specserve.spec_decode.proposer import Proposal, Proposer

# Target features kept per request until the head reads them (a long prompt arrives in several
# prefill chunks; a request may go a long stretch without speculating). Older positions are read
# as zeros. 2048 rows of a 576-wide bf16 model: 2.4 MB per request at most.
MAX_PENDING_FEATURES = 2048


class EagleSeq:
    """The head's view of one request: the target features not yet consumed, the head's own
    blocks and progress (positions built from real features), and the current guesses."""

    def __init__(self, req: Request):
        self.req = req
        self.num_real = 0  # head positions built from the target's real features
        self.num_computed_tokens = 0  # head KV positions, including this proposal's chain
        self.block_ids: list[int] = []
        self.block_hashes: list[int] = []
        self.spec_token_ids: list[int] = []
        self.chunks: list[tuple[int, torch.Tensor]] = []  # (first position, [n, hidden])
        self.num_pending = 0  # rows in chunks
        self.generator = None
        if req.params.seed is not None:  # the head's own stream, so the target's stays intact
            self.generator = torch.Generator().manual_seed(req.params.seed ^ 0xEA61E)

    @property
    def all_token_ids(self) -> list[int]:
        return self.req.all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.req.all_token_ids)

    def add_features(self, first: int, rows: torch.Tensor) -> None:
        self.chunks.append((first, rows))
        self.num_pending += len(rows)
        excess = self.num_pending - MAX_PENDING_FEATURES
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

    def features(self, first: int, n: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
        """Target features at positions first .. first + n - 1 (zeros where none was kept; a
        negative position is the zero feature of head position 0)."""
        out = torch.zeros(n, hidden, dtype=dtype)
        for start, rows in self.chunks:
            lo, hi = max(start, first), min(start + len(rows), first + n)
            if lo < hi:
                out[lo - first:hi - first] = rows[lo - start:hi - start]
        return out

    def drop_features_before(self, position: int) -> None:
        self.chunks = [(max(s, position), r[max(position - s, 0):]) for s, r in self.chunks
                       if s + len(r) > position]
        self.num_pending = sum(len(r) for _, r in self.chunks)


class EagleProposer(Proposer):
    name = "eagle"
    needs_hidden = True

    def __init__(self, path: str, target_cfg, embed_tokens, head_weight: torch.Tensor,
                 tokenizer, dtype: torch.dtype, block_size: int,
                 kv_cache_memory: int | None = None):
        super().__init__()
        self.head = load_eagle(path, target_cfg, embed_tokens, head_weight, dtype, tokenizer)
        self.model_config = self.head.cfg
        own = model_nbytes(self.head)  # fc, the layer, and the LM head rows it keeps
        shared_head = self.head.head_ids is None  # the full LM head is the target's tensor
        if shared_head:
            own -= self.head.lm_head.weight.nbytes
        pack_linears(self.head)
        if shared_head and not isinstance(self.head.lm_head, torch.nn.Linear):
            own += self.head.lm_head.weight_nbytes  # packing made the head a copy after all
        self.weight_bytes = own
        self.dtype = dtype
        self.block_size = block_size
        self.kv_bytes_per_token = kv_bytes_per_token(self.model_config, dtype)
        self.kv_cache_memory = kv_cache_memory
        self.seqs: dict[str, EagleSeq] = {}
        self.num_forwards = 0
        self.num_tokens_computed = 0
        self.time = 0.0

    def allocate_kv_cache(self, num_blocks: int) -> None:
        if self.kv_cache_memory is not None:
            num_blocks = max(self.kv_cache_memory // (self.block_size * self.kv_bytes_per_token),
                             1)
        self.runner = ModelRunner(self.head, self.model_config,
                                  CacheConfig(block_size=self.block_size), num_blocks, self.dtype)
        self.block_manager = BlockManager(num_blocks, self.block_size, enable_prefix_caching=False)
        self.kv_cache_bytes = self.runner.kv_cache_bytes

    def _seq(self, req: Request) -> EagleSeq:
        seq = self.seqs.get(req.request_id)
        if seq is None or seq.req is not req:
            seq = self.seqs[req.request_id] = EagleSeq(req)
        return seq

    def on_target_hidden(self, req: Request, first: int, rows: torch.Tensor) -> None:
        if len(rows):  # a copy: a view would keep the whole step's hidden states alive
            self._seq(req).add_features(first, rows.clone())

    def propose(self, reqs: list[Request], num_tokens: list[int]) -> Proposal:
        t0 = time.perf_counter()
        hidden_size = self.model_config.hidden_size
        proposals: list[list[int]] = [[] for _ in reqs]
        prob_rows: list[list[torch.Tensor]] = [[] for _ in reqs]
        need_probs = any(not r.params.is_greedy for r, k in zip(reqs, num_tokens, strict=True)
                         if k)
        alive = [i for i, k in enumerate(num_tokens) if k > 0]
        seqs = {i: self._seq(reqs[i]) for i in alive}
        prev: dict[int, torch.Tensor] = {}  # the head's last predicted feature per request
        for i in alive:
            seqs[i].spec_token_ids = []
            seqs[i].num_computed_tokens = seqs[i].num_real
        first_forward = True
        while alive:
            batch, feats, batch_ids = [], [], []
            for i in list(alive):
                seq = seqs[i]
                n = seq.num_tokens + len(seq.spec_token_ids) - seq.num_computed_tokens
                if not self.block_manager.allocate(seq, n):
                    alive.remove(i)  # the head's pool is full: this request guesses no further
                    continue
                batch.append((seq, n))
                batch_ids.append(i)
                if first_forward:  # catch up: position j reads the target's feature j - 1
                    feats.append(seq.features(seq.num_real - 1, n, hidden_size, self.dtype))
                else:
                    feats.append(prev[i])
            if not batch:
                break
            inputs = self.runner.prepare(batch)
            features = torch.empty(len(inputs.input_ids), hidden_size, dtype=self.dtype)
            for j, (_, n) in enumerate(batch):
                features[inputs.query_start[j]:inputs.query_start[j] + n] = feats[j]
            out = self.head(inputs.input_ids, inputs.positions, self.runner.kv_caches,
                            inputs.meta, features)
            last = torch.tensor([inputs.query_start[j] + n - 1 for j, (_, n) in enumerate(batch)])
            out = out.index_select(0, last)  # [len(batch), hidden]
            logits = self.head.compute_logits(out)
            self.num_forwards += 1
            self.num_tokens_computed += sum(n for _, n in batch)
            self.last_forward_tokens.append(sum(n for _, n in batch))
            for seq, n in batch:
                seq.num_computed_tokens += n
                if first_forward:  # real-feature positions: kept across proposals
                    seq.num_real = seq.num_computed_tokens
                    seq.drop_features_before(seq.num_real - 1)
            tokens, probs = draft_tokens(logits, [seqs[i].req.params for i in batch_ids],
                                         [seqs[i].generator for i in batch_ids],
                                         self.head.head_ids, self.model_config.vocab_size,
                                         need_probs)
            for j, (i, token) in enumerate(zip(batch_ids, tokens.tolist(), strict=True)):
                proposals[i].append(token)
                seqs[i].spec_token_ids.append(token)
                prev[i] = out[j:j + 1]
                if need_probs:
                    prob_rows[i].append(probs[j])
            alive = [i for i in batch_ids if len(proposals[i]) < num_tokens[i]]
            first_forward = False
        for seq in seqs.values():  # the chain's KV is rebuilt from real features next time
            seq.num_computed_tokens = seq.num_real
        self.time += time.perf_counter() - t0
        probs_out = None
        if need_probs:
            rows = [r for per_req in prob_rows for r in per_req]
            probs_out = torch.stack(rows) if rows else None
        return Proposal(proposals, probs_out)

    def catch_up_tokens(self, req: Request) -> int:
        seq = self.seqs.get(req.request_id)
        return req.num_tokens - (seq.num_real if seq else 0)

    def on_verified(self, req: Request, num_draft: int, num_accepted: int) -> None:
        seq = self.seqs.get(req.request_id)
        if seq is not None:
            seq.spec_token_ids = []

    def free(self, req: Request) -> None:
        seq = self.seqs.pop(req.request_id, None)
        if seq is not None:
            self.block_manager.free(seq)
