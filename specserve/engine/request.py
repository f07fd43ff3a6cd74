"""A request's state as the scheduler sees it: tokens known vs tokens whose KV is computed."""

from __future__ import annotations

import enum
import time

import torch

from specserve.lora.adapter import LoRAAdapter
from specserve.outputs import Logprob
from specserve.sample.penalties import has_logit_processing
from specserve.sample.token_bans import BadWords
from specserve.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


FINISH_REASONS = {RequestStatus.FINISHED_STOPPED: "stop", RequestStatus.FINISHED_LENGTH: "length",
                  RequestStatus.FINISHED_ABORTED: "abort"}


class Request:
    """Scheduling works on one invariant (vLLM v1): the first `num_computed_tokens` of
    `all_token_ids` have their K/V in the cache. Prefill, chunked prefill, prefix-cache hits,
    preemption and speculation all move that one counter."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 eos_token_ids: tuple[int, ...] = (), prompt: str | None = None,
                 max_model_len: int | None = None):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache
        self.status = RequestStatus.WAITING
        self.priority = 0  # lower runs first under the priority scheduling policy
        self.lora: LoRAAdapter | None = None  # the adapter its rows run (engine's enable_lora)
        self.stop_reason: int | str | None = None
        self.block_ids: list[int] = []
        self.cache_salt = params.cache_salt  # vLLM's: prefix-cache isolation (block_manager)
        self.block_hashes: list[int] = []  # chained hashes of the full blocks of all_token_ids
        self.num_hashed_blocks = 0  # leading blocks already offered to the prefix cache
        self.spec_token_ids: list[int] = []  # draft tokens scheduled for verification
        self.spec_probs: torch.Tensor | None = None  # [len(spec_token_ids), vocab] or None
        self.spec_from_grammar = False  # spec_token_ids are the grammar's forced tokens
        self.spec_evidence = 0  # what the proposer's first guess rested on (Proposal.evidence)
        self.jump_forward_tail: tuple[int, int] | None = None  # (token, position): see grammar
        self.num_draft_tokens = 0  # proposed and verified, over the request's life
        self.num_accepted_tokens = 0
        self.stream = False
        self.num_preemptions = 0
        self.stop_token_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            self.stop_token_ids.update(eos_token_ids)
        max_tokens = params.max_tokens
        if max_model_len is not None:
            room = max_model_len - len(prompt_token_ids)
            max_tokens = room if max_tokens is None else min(max_tokens, room)
        self.max_tokens = max_tokens if max_tokens is not None else 16
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)
        self.grammar = None  # xgrammar GrammarMatcher of a structured-output request
        # While the grammar waits for the end of reasoning (StructuredOutputsParams.
        # starts_after): its bytes, and the output's last bytes that may begin them.
        self.grammar_after: bytes | None = None
        self.grammar_tail = b""
        self.processes_logits = has_logit_processing(params)  # bias, penalties, bans
        self.unique_prompt_ids: torch.Tensor | None = None  # repetition_penalty, made once
        # logit_bias as (token ids, values), made once (sample/penalties.py)
        self.logit_bias_tensors: tuple[torch.Tensor, torch.Tensor] | None = None
        # allowed_token_ids as a tensor, made once; bad_words encoded and indexed by the
        # engine (sample/token_bans.py)
        self.allowed_ids: torch.Tensor | None = None
        self.bad_words: BadWords | None = None
        self.cumulative_logprob = 0.0
        self.logprobs: list[dict[int, Logprob]] = []
        # With params.prompt_logprobs: one entry per prompt token recorded so far (the first
        # token has none: None), filled as prefill chunks compute their positions.
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = (
            None if params.prompt_logprobs is None else [None])
        # Detokenizer state (only used for stop strings and streaming).
        self.output_text = ""
        self.prefix_offset = 0
        self.read_offset = 0
        self.decode_stream = None  # tokenizers.decoders.DecodeStream, made on first use
        self.detok_context: list[int] | None = None  # the window fallback's prompt tail
        # Timing (seconds, time.perf_counter())
        self.arrival_time = time.perf_counter()
        self.scheduled_time: float | None = None  # first admitted (a re-admission keeps it)
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None  # the latest step that emitted tokens
        self.finished_time: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def max_cached_prefix(self) -> int:
        """Tokens a prefix-cache hit may serve: all but the last (its logits are sampled
        from), or, while prompt logprobs are missing, only the positions whose logits were
        recorded (a served position computes no logits)."""
        if self.prompt_logprobs is not None and \
                len(self.prompt_logprobs) < self.num_prompt_tokens:
            return len(self.prompt_logprobs) - 1
        return self.num_tokens - 1

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def drafts_nothing(self) -> bool:
        """A seeded sampled request verifies no drafts: each draft takes draws from its
        generator, and how many it gets depends on the batch (the controller's plan, the token
        budget), which would break "the same seed, the same tokens, whatever else runs"."""
        return self.generator is not None and not self.params.is_greedy

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def append_token(self, token_id: int) -> None:
        self.all_token_ids.append(token_id)
        self.output_token_ids.append(token_id)
