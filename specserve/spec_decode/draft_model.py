"""Draft-model proposer: a separate, smaller model with its own weights, its own paged KV cache
and its own block pool (Leviathan et al. 2023; Chen et al. 2023).

The draft keeps its own `num_computed_tokens` per request. Proposing K tokens is K batched draft
forwards: the first one catches up on every token the draft has not seen yet (the prompt at
first, less a prefix its pool has cached, then the tokens accepted since, or many tokens after a
stretch with speculation off), the
next K-1 feed back the draft's own guesses. After verification the draft rolls back to the last
accepted position: its KV for rejected guesses is simply overwritten later.

`draft_layers=N` builds a self-draft: an independent copy of the target's first N layers plus its
final norm and LM head, the offline stand-in for "a 1B draft for a 70B target".

A draft trained by `specserve train-draft` shares the target's embedding (passed in as
`target_embedding`) and may have a head over part of the vocabulary (draft_head.py).

The draft's pool has automatic prefix caching when the engine's has: the draft's KV at a position
depends on the tokens up to it alone, so a prefix it computed for one request serves the next.
Without it, every request's first proposal caught up on its whole prompt, a shared RAG document
included: the 4-layer self-draft on rag at concurrency 1 spent 0.19 s drafting 8 tokens in a run,
~16 decode steps, most of it catching up on the 2.5k-token document
(docs/results/2026-12-06-session40/sweep-draft-detail.txt).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time

import torch

from specserve.engine.model_runner import kv_bytes_per_token
from specserve.engine.request import Request
from specserve.layers.linear import pack_linears
from specserve.models.llama import build_model
from specserve.models.loader import load_model
from specserve.quant.swap import apply_quantization, model_nbytes
from specserve.spec_decode.config import SpeculativeConfig
from specserve.spec_decode.draft_head import check_head_ids, draft_tokens, reduced_head
from specserve.spec_decode.model_proposer import (
    CATCH_UP_CHUNK,
    ModelProposer,
    ProposerSeq,
    stack_probs,
)
from specserve.spec_decode.proposer import Proposal

logger = logging.getLogger(__name__)


class DraftSeq(ProposerSeq):
    """The draft's view of one request (model_proposer.ProposerSeq)."""

    seed_salt = 0x5EED


def check_same_tokenizer(target_tok, draft_tok) -> None:
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv != dv:
        raise ValueError(
            f"the draft model's tokenizer does not match the target's (vocabulary of {len(dv)} "
            f"vs {len(tv)} tokens, {len(set(tv.items()) ^ set(dv.items()))} entries differ); "
            "speculative decoding needs the same tokenizer")


class DraftModelProposer(ModelProposer):
    name = "draft"
    seq_type = DraftSeq
    prefix_cacheable = True

    def __init__(self, spec: SpeculativeConfig, target_model: str | None, target_tokenizer,
                 dtype: torch.dtype, block_size: int, num_threads: int | None = None,
                 target_embedding: torch.Tensor | None = None,
                 device: torch.device | str = "cpu", target_vocab_size: int | None = None):
        super().__init__()
        loaded = load_model(spec.model if spec.model is not None else target_model,
                            shared_embedding=target_embedding)
        check_same_tokenizer(target_tokenizer, loaded.tokenizer)
        cfg, sd = loaded.config, loaded.state_dict
        if target_vocab_size is not None and cfg.vocab_size != target_vocab_size:
            # Same tokenizer, embedding rows padded differently (Qwen2.5-0.5B's 151,936 against
            # 7B's 152,064): the draft's q would not line up with the target's p.
            raise ValueError(
                f"the draft model's vocabulary has {cfg.vocab_size} rows and the target's "
                f"{target_vocab_size}; speculative decoding needs the same vocabulary size")
        if spec.draft_layers is not None:
            if spec.draft_layers > cfg.num_layers:
                raise ValueError(f"draft_layers={spec.draft_layers} but the model has only "
                                 f"{cfg.num_layers} layers")
            cfg = dataclasses.replace(cfg, num_layers=spec.draft_layers)
            sd = {k: v for k, v in sd.items()
                  if not k.startswith("layers.") or int(k.split(".")[1]) < spec.draft_layers}
        self.model_config = cfg
        self.max_context = cfg.max_position
        self.head_ids = None  # vocabulary id of each head row, when the head is reduced
        if loaded.head_token_ids is not None:
            # Build with a (tied) full head, then swap in the reduced one.
            sd = dict(sd)
            head = sd.pop("lm_head.weight").to(dtype)
            self.model = build_model(dataclasses.replace(cfg, tie_word_embeddings=True), sd, dtype,
                                     device)
            self.model.lm_head = reduced_head(head.to(device))
            self.head_ids = torch.tensor(loaded.head_token_ids, dtype=torch.long)
            check_head_ids(self.head_ids, head.shape[0], cfg.vocab_size, str(spec.model))
        else:
            self.model = build_model(cfg, sd, dtype, device)
        shared = 0
        if loaded.shares_embedding and target_embedding.dtype == dtype:
            # One embedding in memory for both models, not a copy per model.
            self.model.embed_tokens.weight = target_embedding
            shared = target_embedding.nbytes
        raw = loaded.raw_quantized
        if spec.draft_layers is not None:
            raw = {k: v for k, v in raw.items() if int(k.split(".")[1]) < spec.draft_layers}
        if spec.quantization == "int4" and not loaded.calibration:
            logger.warning("int4 draft without calibration data (a draft directory from "
                           "`specserve train-draft` has it): rounding to nearest, which can "
                           "cost a small draft most of its acceptance")
        apply_quantization(self.model, spec.quantization, raw, calibration=loaded.calibration,
                           draft=True)
        self.weight_bytes = model_nbytes(self.model) + pack_linears(self.model) - shared
        self.dtype = dtype
        self.block_size = block_size
        self.kv_bytes_per_token = kv_bytes_per_token(cfg, dtype)
        self.kv_cache_memory = spec.kv_cache_memory
        self.catch_up_chunk: int | None = None  # None: decided by the attention path

    def propose(self, reqs: list[Request], num_tokens: list[int]) -> Proposal:
        t0 = time.perf_counter()
        proposals: list[list[int]] = [[] for _ in reqs]
        prob_rows: list[list[torch.Tensor]] = [[] for _ in reqs]
        vocab_size = self.model_config.vocab_size
        need_probs = any(not r.params.is_greedy for r, k in zip(reqs, num_tokens, strict=True)
                         if k)
        alive = [i for i, k in enumerate(num_tokens) if k > 0]
        seqs = {i: self._seq(reqs[i]) for i in alive}
        bm = self.block_manager
        # A long catch-up (a new request's whole prompt) runs in chunks where attention
        # materialises its scores (every path but the CPU kernel): one 32k-token forward would
        # need tens of GiB there.
        chunk = self.catch_up_chunk or (sys.maxsize if self.runner.use_kernel
                                        else CATCH_UP_CHUNK)
        for i in alive:
            seqs[i].spec_token_ids = []
            self._cache_computed(seqs[i])
        while alive:
            batch = []
            for i in list(alive):
                seq = seqs[i]
                cached = bm.find_cached_prefix(seq) if not seq.block_ids else []
                seq.num_computed_tokens += len(cached) * bm.block_size
                n = min(seq.num_tokens + len(seq.spec_token_ids) - seq.num_computed_tokens,
                        chunk)
                if not bm.allocate(seq, n, cached):
                    seq.num_computed_tokens -= len(cached) * bm.block_size
                    alive.remove(i)  # the draft pool is full: this request guesses no further
                    continue
                self.num_prefix_hit_tokens += len(cached) * bm.block_size
                batch.append((seq, n))
            if not batch:
                break
            inputs = self.runner.prepare(batch)
            last = torch.tensor([inputs.query_start[j] + n - 1 for j, (_, n) in enumerate(batch)])
            _, logits = self.runner.execute(inputs, last)  # [len(batch), vocab]
            self.num_forwards += 1
            self.num_tokens_computed += sum(n for _, n in batch)
            self.last_forwards.append((sum(n for _, n in batch), len(batch),
                                       [(seq.num_computed_tokens, n) for seq, n in batch]))
            for seq, n in batch:
                seq.num_computed_tokens += n
                # Offered at once, not at its next proposal: a request that stops drafting (K =
                # 0) would keep a shared prompt's blocks from the others until then. Only the
                # blocks below its real tokens are registered, never a guess's.
                bm.cache_blocks(seq)
            # alive and batch are in the same order; a sequence still catching up (a chunk
            # short of its last token) guesses nothing yet.
            ready = [j for j, (seq, _) in enumerate(batch)
                     if seq.num_computed_tokens == seq.num_tokens + len(seq.spec_token_ids)]
            guessing = [alive[j] for j in ready]
            if guessing:
                tokens, probs = draft_tokens(logits[ready], [seqs[i].req.params for i in guessing],
                                             [seqs[i].generator for i in guessing],
                                             self.head_ids, vocab_size, need_probs)
                for j, (i, token) in enumerate(zip(guessing, tokens.tolist(), strict=True)):
                    proposals[i].append(token)
                    seqs[i].spec_token_ids.append(token)
                    if need_probs:
                        prob_rows[i].append(probs[j])
            alive = [i for i in alive if len(proposals[i]) < num_tokens[i]]
        self.time += time.perf_counter() - t0
        return Proposal(proposals, stack_probs(prob_rows, need_probs))

    def catch_up_tokens(self, req: Request) -> int:
        seq = self.seqs.get(req.request_id)
        if seq is not None and seq.block_ids:
            return req.num_tokens - seq.num_computed_tokens
        return req.num_tokens - self.block_manager.cached_prefix_hint(self._seq(req))

    def _cache_computed(self, seq: DraftSeq) -> None:
        """Offer seq's full blocks to the prefix cache, when all it has computed are real
        tokens (rolled back after verification; not when a request is dropped between its
        proposal and its verification, with KV for guesses past its tokens)."""
        if seq.num_computed_tokens <= seq.num_tokens:
            self.block_manager.cache_blocks(seq)

    def free(self, req: Request) -> None:
        seq = self.seqs.get(req.request_id)
        if seq is not None:
            self._cache_computed(seq)  # what it computed since its last proposal
        super().free(req)

    def on_verified(self, req: Request, num_draft: int, num_accepted: int) -> None:
        seq = self.seqs.get(req.request_id)
        if seq is None:
            return
        # Valid draft KV: everything before the first rejected guess (req.num_tokens is still
        # the count before the accepted tokens are appended).
        seq.num_computed_tokens = min(seq.num_computed_tokens, req.num_tokens + num_accepted)
        seq.spec_token_ids = []
