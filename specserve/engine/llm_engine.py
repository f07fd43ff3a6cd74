"""The engine loop: add requests, step (schedule -> forward -> sample -> update), stream outputs."""

from __future__ import annotations

import bisect
import dataclasses
import functools
import logging
import operator
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specserve.config import EngineConfig
from specserve.engine.block_manager import BlockManager
from specserve.engine.detokenizer import decode
from specserve.engine.model_runner import ModelRunner, kv_bytes_per_token
from specserve.engine.output_processor import (
    check_stop,
    make_output,
    record_logprobs,
    record_prompt_logprobs,
)
from specserve.engine.prompts import (
    encode_chat,
    encode_prompt,
    set_chat_template,
    truncate_prompt,
)
from specserve.engine.request import Request, RequestStatus
from specserve.engine.scheduler import Scheduler
from specserve.engine.spec_planner import SpeculationPlanner, draft_room
from specserve.hardware import describe_cpu_precision
from specserve.layers import paged_attention_ext
from specserve.layers.kv_cache import resolve_kv_dtype
from specserve.layers.linear import pack_linears
from specserve.lora.adapter import LoRAAdapter, load_adapter
from specserve.lora.request import LoRARequest
from specserve.models.generation_config import resolve_sampling_defaults
from specserve.models.llama import build_model
from specserve.models.loader import load_model
from specserve.outputs import RequestOutput
from specserve.quant.swap import apply_quantization, model_nbytes
from specserve.sample.emit import emit_tokens, mask_stops_before_min_tokens
from specserve.sample.grammar import GrammarBackend
from specserve.sample.penalties import apply_penalties
from specserve.sample.token_bans import BadWords, apply_token_bans, bad_words_token_ids
from specserve.sampling_params import SamplingParams
from specserve.spec_decode import build_proposer
from specserve.spec_decode.config import SpeculativeConfig
from specserve.spec_decode.policy import SpecPolicy, build_policy
from specserve.spec_decode.profiler import profile_forward

# Prompt positions scored per LM-head call (prompt_logprobs): bounds their fp32 logits.
PROMPT_LOGPROBS_ROWS = 128
STEP_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)  # vLLM's


@dataclass(slots=True)
class EngineStats:
    num_steps: int = 0
    num_prompt_tokens: int = 0  # prompt tokens computed (prefix-cache hits excluded)
    num_generated_tokens: int = 0
    num_preemptions: int = 0
    forward_time: float = 0.0  # seconds in model forwards
    step_time: float = 0.0  # seconds in step() overall
    num_draft_tokens: int = 0  # draft tokens verified by the target
    num_accepted_tokens: int = 0
    num_verifications: int = 0  # (request, step) pairs that verified >= 1 draft token
    # Accepted draft tokens by position in their draft (vLLM's accepted_tokens_per_pos).
    accepted_per_position: list[int] = field(default_factory=list)
    draft_time: float = 0.0  # seconds proposing
    verify_time: float = 0.0  # seconds in target forwards of steps that verified drafts
    # Seconds a step spends on speculation outside the target's forward: handing features
    # over, observing, planning, proposing (draft forwards included). With every K_i = 0 it
    # is what the controller costs on top of `off`.
    spec_time: float = 0.0
    # Grammar-forced drafts (jump-forward), counted apart from the proposer's so that its
    # acceptance stays its own.
    num_jump_forward_tokens: int = 0
    num_jump_forward_accepted: int = 0
    # Tokens scheduled per step (prefill chunks, decode tokens, drafts verified): steps per
    # bucket of STEP_TOKEN_BUCKETS (<= each bound; the last slot counts larger steps), and
    # their sum.
    step_token_counts: list[int] = field(
        default_factory=lambda: [0] * (len(STEP_TOKEN_BUCKETS) + 1))
    num_step_tokens: int = 0
    # vLLM's iteration_tokens_total, the same way: per step, the whole prompts whose prefill
    # it finished (cached tokens included) plus the tokens it emitted.
    iteration_token_counts: list[int] = field(
        default_factory=lambda: [0] * (len(STEP_TOKEN_BUCKETS) + 1))
    num_iteration_tokens: int = 0


logger = logging.getLogger("specserve")


def _available_memory(device: torch.device) -> int:
    """Free bytes where the KV pool will live (a fractional kv_cache_memory is a share of it)."""
    if device.type == "cuda":
        # What the caching allocator holds unused (the weights quantization replaced) is
        # handed back first, or it would read as taken.
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 << 30


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None):
        self.config = config = config or EngineConfig()
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        torch.manual_seed(config.seed)
        t0 = time.perf_counter()
        loaded = load_model(config.model)
        self.model_config = cfg = loaded.config
        # The model author's sampling defaults; a request's own values win (validated here, so
        # that a bad file fails the start and not every request).
        self.sampling_defaults = resolve_sampling_defaults(
            config.generation_config, loaded.path if Path(loaded.path).is_dir() else None)
        self.default_sampling_params()  # SamplingParams validates them
        self.model_name = loaded.name
        self.tokenizer = loaded.tokenizer
        set_chat_template(self.tokenizer, config.chat_template, loaded.name)
        # A logprob entry's decoded_token: each token decoded alone, once.
        self._token_text = functools.lru_cache(maxsize=1 << 16)(
            lambda token: decode(self.tokenizer, [token]))
        self.dtype = config.torch_dtype
        self.device = torch.device(config.device)
        if self.device.type == "cpu":
            logger.info("dtype %s (%s); %s", self.dtype, config.dtype, describe_cpu_precision())
        self.model = build_model(cfg, loaded.state_dict, self.dtype, self.device)
        loaded.state_dict.clear()  # copied into the model: a checkpoint's worth of host memory
        # The LM head's weight as a plain tensor (an EAGLE head shares it): packing and
        # quantization below replace the module.
        lm_head_weight = self.model.lm_head.weight
        apply_quantization(self.model, config.quantization, loaded.raw_quantized)
        self.weight_bytes = model_nbytes(self.model) + pack_linears(self.model)
        cache = config.cache
        kv_dtype = resolve_kv_dtype(cache.kv_cache_dtype, self.dtype)
        # A draft model shares the memory budget: its weights and its own KV pool come out of
        # kv_cache_memory, and the two pools hold the same number of tokens (the seed's
        # "dual KV cache" cost, made real and reported).
        self.spec_config = SpeculativeConfig.from_dict(config.speculative_config)
        budget = cache.kv_cache_memory
        if isinstance(budget, float):
            # Measured before the draft loads: its weights are charged below, once (measured
            # after, they were already missing from what was free).
            budget = int(budget * _available_memory(self.device))
        self.proposer = build_proposer(self.spec_config, config, self.tokenizer, cache.block_size,
                                       self.model.embed_tokens, lm_head_weight, cfg)
        draft_fixed = self.proposer.weight_bytes if self.proposer else 0
        draft_per_token = self.proposer.kv_bytes_per_token if self.proposer else 0
        explicit = getattr(self.proposer, "kv_cache_memory", None)
        if explicit is not None:  # the draft pool's own size, paid once, not per target token
            draft_fixed, draft_per_token = draft_fixed + explicit, 0
        token_bytes = kv_bytes_per_token(cfg, kv_dtype)
        block_bytes = cache.block_size * (token_bytes + draft_per_token)
        if cache.num_blocks is None and budget - draft_fixed < block_bytes:
            what = "weights and KV pool" if explicit is not None else "weights"
            draft = f"the draft's {what} ({draft_fixed / 2**20:.0f} MiB) plus " \
                if draft_fixed else ""
            raise ValueError(f"kv_cache_memory ({budget} bytes) does not cover {draft}one KV "
                             f"block ({block_bytes} bytes): raise kv_cache_memory")
        num_blocks = cache.num_blocks or max((budget - draft_fixed) // block_bytes, 1)
        self.runner = ModelRunner(self.model, cfg, cache, num_blocks, kv_dtype)
        self.runner.lora_enabled = config.enable_lora
        self.loras: dict[int, LoRAAdapter] = {}  # by lora_int_id (add_lora)
        if self.device.type != "cpu":
            # Sampling stays on the host, and its argmax uses the CPU extension: built here,
            # not inside the first request's time to first token (10-50 s).
            paged_attention_ext.available()
        self.block_manager = BlockManager(num_blocks, cache.block_size, cache.enable_prefix_caching)
        if self.proposer is not None:
            self.proposer.allocate_kv_cache(num_blocks, cache.enable_prefix_caching)
            self.runner.aux_layers = self.proposer.aux_layers
        self.scheduler = Scheduler(config.scheduler, self.block_manager)
        pool_tokens = num_blocks * cache.block_size
        limit = config.max_model_len
        if limit is not None and limit > cfg.max_position:
            raise ValueError(f"max_model_len {limit} is longer than the model's context, "
                             f"{cfg.max_position} tokens")
        if limit is not None and limit > pool_tokens:
            # vLLM refuses too: one request of that length could never run.
            raise ValueError(f"max_model_len {limit} is more than the KV pool holds "
                             f"({pool_tokens} tokens): raise kv_cache_memory or lower "
                             "max_model_len")
        self.max_model_len = limit or min(cfg.max_position, pool_tokens)
        logger.info("KV cache: %d blocks x %d tokens, %s, %.0f MiB; holds %d tokens = %d "
                    "concurrent 1k-token sequences", num_blocks, cache.block_size, kv_dtype,
                    self.runner.kv_cache_bytes / 2**20, num_blocks * cache.block_size,
                    num_blocks * cache.block_size // 1024)
        self.requests: dict[str, Request] = {}
        self.stats = EngineStats()
        # Exists exactly when a proposer does.
        # A draft model with a shorter context than the target's drafts only below it (vLLM's
        # speculative_max_model_len); longer requests decode without it.
        self.planner: SpeculationPlanner | None = SpeculationPlanner(
            self.proposer, self.scheduler, self.stats,
            min(self.max_model_len, self.proposer.max_context or self.max_model_len)) \
            if self.proposer is not None else None
        self.profile_time = 0.0  # start-up profile of the cost model (seconds)
        self._cost_models = None
        self.spec_policy = self._build_policy(config.speculation_policy)
        self.load_time = time.perf_counter() - t0
        self._next_id = 0
        self._grammar: GrammarBackend | None = None  # built on the first structured request
        # Most grammar-forced drafts per request per step (config.jump_forward_tokens); an
        # attribute, so that a benchmark or test can switch it on one engine.
        self.jump_forward_tokens = config.jump_forward_tokens
        self._grammar_lock = threading.Lock()

    def _build_policy(self, name: str, k_max: int | None = None) -> SpecPolicy | None:
        if self.proposer is None:
            if name not in ("adaptive", "off"):
                build_policy(name, 1)  # a bad name is refused, proposer or not
                logger.warning("speculation_policy %r without a speculative_config: there is "
                               "no proposer, and grammar-forced drafts run under any policy "
                               "but off", name)
            return None
        k_max = self.spec_config.num_speculative_tokens if k_max is None else k_max
        if name != "adaptive":
            return build_policy(name, k_max)
        if self._cost_models is None:  # profiled once per engine, kept across policy switches
            # The profile's fake sequences write garbage over the pool: nothing may live there.
            if self.scheduler.has_unfinished():
                raise ValueError("switching to the adaptive policy the first time profiles the "
                                 "model: finish or abort running requests first")
            t0 = time.perf_counter()
            if self.proposer.needs_hidden:  # (steps under `off` left the layer streams off)
                self.runner.aux_layers = self.proposer.aux_layers
            target_cost = profile_forward(self.runner)
            draft_runner = getattr(self.proposer, "runner", None)
            draft_cost = profile_forward(draft_runner) if draft_runner is not None else None
            self._cost_models = (target_cost, draft_cost)
            # Their blocks now hold the profile's garbage. (Not the whole proposer's reset: a
            # suffix proposer's cached replies are no garbage.)
            self.block_manager.reset_prefix_cache()
            if draft_runner is not None:
                self.proposer.reset_prefix_cache()
            self.profile_time = time.perf_counter() - t0
        return build_policy(name, k_max, *self._cost_models)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix no request holds, the target's and the draft's
        (benchmarks that measure cold prefills)."""
        self.block_manager.reset_prefix_cache()
        if self.proposer is not None:
            self.proposer.reset_prefix_cache()

    def set_speculation_policy(self, name: str, k_max: int | None = None) -> None:
        """Switch the engine-wide policy (and its K_max) in place. The proposer, weights and KV
        pool stay; the new policy starts with fresh acceptance estimates. `bench sweep` uses it
        to compare policies on one engine instance: two instances of the same engine differ by
        up to ~10% in speed on this machine (memory placement), more than the policies do."""
        if self.proposer is None:
            raise ValueError("speculation policies need a speculative_config (a proposer)")
        self.spec_policy = self._build_policy(name, k_max)
        self.planner.reset()

    # ---- requests -------------------------------------------------------------------------
    def tokenize(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def default_sampling_params(self) -> SamplingParams:
        """What a request that sets nothing samples with (vLLM's name and meaning)."""
        return SamplingParams(**self.sampling_defaults)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        return encode_chat(self.tokenizer, messages)

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, stream: bool = False,
                    arrival_time: float | None = None, priority: int = 0,
                    lora_request: LoRARequest | None = None, load_lora: bool = True,
                    compiled_grammar: Any = None) -> Request:
        """Validate and queue a request. Raises ValueError for bad input; nothing else changes.
        arrival_time (time.perf_counter()): when it reached the front end, if earlier than now
        (the server's: its queue time and TTFT then count the wait for the engine thread).
        priority: vLLM's; lower is served first, under scheduling_policy="priority" only.
        lora_request: the adapter to run it with (loaded on first use; enable_lora). With
        load_lora=False (the server, whose adapters are loaded beforehand) an adapter that is
        not loaded is refused: reading one here would stall every running request.
        compiled_grammar: compile_grammar's result for params' structured outputs, if the
        caller compiled it beforehand (the server, off the engine thread)."""
        # A copy, normalised and validated again (a `stop` string set after construction
        # becomes a list): the request must not change with the caller's object either.
        params = dataclasses.replace(params) if params is not None \
            else self.default_sampling_params()
        if isinstance(priority, bool) or not hasattr(priority, "__index__"):
            raise ValueError(f"priority must be an integer, not {priority!r}")
        priority = operator.index(priority)  # a numpy integer too
        if priority and not self.scheduler.by_priority:
            raise ValueError(f"priority {priority} needs priority scheduling: start the engine "
                             "with scheduling_policy='priority' (--scheduling-policy priority)")
        if params.n != 1:
            raise ValueError(f"the engine runs one sequence per request (n={params.n}): "
                             "LLM.generate and the server fan n out, one request per choice")
        if isinstance(prompt, str):
            prompt_text, token_ids = prompt, self.tokenize(prompt)
        else:
            prompt_text, token_ids = None, list(prompt)
        if not token_ids:
            raise ValueError("the prompt is empty")
        if (k := params.truncate_prompt_tokens) is not None:
            token_ids = truncate_prompt(token_ids, self.max_model_len if k == -1 else k,
                                        self.tokenizer if prompt_text is not None else None)
        vocab = self.model_config.vocab_size
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in token_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise ValueError(f"logit_bias token ids must be in [0, {vocab})")
        if params.allowed_token_ids and max(params.allowed_token_ids) >= vocab:
            raise ValueError(f"allowed_token_ids must be in [0, {vocab})")
        if params.stop_token_ids and max(params.stop_token_ids) >= vocab:
            # never sampled; with structured outputs xgrammar's matcher raised a RuntimeError
            raise ValueError(f"stop_token_ids must be in [0, {vocab})")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(token_ids)} tokens, but the maximum context "
                             f"length is {self.max_model_len} (prompt plus at least one token)")
        if request_id is None:
            request_id = f"req-{self._next_id}"
            self._next_id += 1
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        req = Request(request_id, token_ids, params, self.model_config.eos_token_ids,
                      prompt_text, self.max_model_len)
        if arrival_time is not None:
            req.arrival_time = min(arrival_time, req.arrival_time)
        req.priority = priority
        if params.bad_words:
            req.bad_words = BadWords(bad_words_token_ids(self.tokenizer, params.bad_words,
                                                         vocab))
        if params.structured_outputs is not None:
            req.grammar = self._grammar_backend().matcher(params.structured_outputs,
                                                          req.stop_token_ids, compiled_grammar)
            if (after := params.structured_outputs.starts_after) is not None:
                req.grammar_after = after.encode()
        req.stream = stream or bool(params.stop)
        if lora_request is not None:  # last: a request refused for anything else loads none
            req.lora = self.add_lora(lora_request) if load_lora else self._loaded_lora(
                lora_request)
        self.requests[request_id] = req
        self.scheduler.add_request(req)
        return req

    # ---- LoRA adapters (vLLM's add_lora / remove_lora / list_loras) ----------------------------
    def add_lora(self, lora_request: LoRARequest) -> LoRAAdapter:
        """Load an adapter (once per lora_int_id) and return it. Raises ValueError for an engine
        without enable_lora, an id already taken by another adapter, or an adapter that does
        not fit the model (specserve/lora/adapter.py)."""
        if not self.config.enable_lora:
            raise ValueError("LoRA adapters need an engine started with enable_lora=True "
                             "(--enable-lora)")
        known = self.loras.get(lora_request.lora_int_id)
        if known is not None:
            if not _same_path(known.request.lora_path, lora_request.lora_path):
                raise ValueError(f"lora_int_id {lora_request.lora_int_id} is already "
                                 f"{known.request.lora_path!r}, not {lora_request.lora_path!r}")
            return known
        try:
            adapter = load_adapter(lora_request, self.model_config, self.config.max_lora_rank,
                                   self.dtype, self.device)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            # The client's request that does not fit: a 400 on the server, as in vLLM, and
            # the engine goes on with what it holds.
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            raise ValueError(f"LoRA adapter {lora_request.lora_name!r}: not enough memory to "
                             f"load it ({type(exc).__name__}); unload an adapter or lower "
                             "max_lora_rank") from None
        self.loras[lora_request.lora_int_id] = adapter
        logger.info("LoRA adapter %r (id %d, rank %d, %.1f MiB) from %s", lora_request.lora_name,
                    lora_request.lora_int_id, adapter.rank, adapter.nbytes / 2**20,
                    lora_request.lora_path)
        return adapter

    def _loaded_lora(self, lora_request: LoRARequest) -> LoRAAdapter:
        adapter = self.loras.get(lora_request.lora_int_id)
        if adapter is None or adapter.request != lora_request:
            # (an id now held by other weights is the same case: never run a request with them;
            # the server passes the very LoRARequest it loaded, so no path is resolved here)
            raise ValueError(f"LoRA adapter {lora_request.lora_name!r} is not loaded (unloaded "
                             "meanwhile?)")
        return adapter

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget an adapter; requests running with it finish with it."""
        return self.loras.pop(lora_int_id, None) is not None

    def list_loras(self) -> set[int]:
        return set(self.loras)

    def _grammar_backend(self) -> GrammarBackend:
        with self._grammar_lock:  # the server compiles on other threads (compile_grammar)
            if self._grammar is None:
                self._grammar = GrammarBackend(self.tokenizer, self.model_config.vocab_size,
                                               self.model_config.eos_token_ids)
            return self._grammar

    def compile_grammar(self, params: SamplingParams) -> Any:
        """Compile a request's structured-outputs spec, from any thread, and return it for
        add_request's compiled_grammar (the compiler's cache may have evicted it by the time
        the request is added: compiling again there would stall the engine thread). Raises
        ValueError for a spec that does not compile."""
        if params.structured_outputs is None:
            return None
        return self._grammar_backend().compile(params.structured_outputs)

    def abort_request(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None and not req.is_finished:
            self.scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
            self._free_spec_state(req)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the loop ---------------------------------------------------------------------------
    def step(self, on_forward: Callable[[], None] | None = None) -> list[RequestOutput]:
        """One iteration: schedule, run one forward over the whole batch (prefill chunks, decodes
        and speculative verification mixed), sample or verify, update, propose for the next
        step. Returns an output for every request that produced tokens or finished.
        on_forward: called once the batch is prepared, just before the forward (or before
        returning, if nothing was scheduled). A server hands the previous step's outputs to its
        other threads there, so that their Python runs while the forward has released the GIL
        instead of interleaving with this step's scheduling (vLLM V0's async output processing
        overlaps the same way)."""
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        self.stats.num_preemptions += len(sched.preempted)
        for req in sched.preempted:
            self._free_spec_state(req, preempted=True)
        if not sched.scheduled:
            if on_forward is not None:
                on_forward()
            return []
        inputs = self.runner.prepare(sched.scheduled)
        sampling: list[tuple[Request, int]] = []  # (request, draft tokens verified)
        logits_indices: list[int] = []
        # (request, first row, rows): hidden rows whose logits score the prompt's next tokens
        scoring: list[tuple[Request, int, int]] = []
        for i, (req, n) in enumerate(sched.scheduled):
            end = req.num_computed_tokens + n
            if end >= req.num_tokens:  # reaches the last known token: this step samples
                num_spec = end - req.num_tokens
                last = inputs.query_start[i] + n - 1
                logits_indices.extend(range(last - num_spec, last + 1))
                sampling.append((req, num_spec))
            if req.num_computed_tokens < req.num_prompt_tokens:
                self.stats.num_prompt_tokens += min(n, req.num_prompt_tokens
                                                    - req.num_computed_tokens)
            if req.prompt_logprobs is not None:
                # Position p's logits score prompt token p + 1: the positions from the first
                # unscored one to the prompt's second last (a recomputation after a
                # preemption scores nothing twice).
                first = len(req.prompt_logprobs) - 1
                stop = min(end, req.num_prompt_tokens - 1)
                if stop > first:
                    scoring.append((req, inputs.query_start[i] + first - req.num_computed_tokens,
                                    stop - first))
        featured: list[bool] = []  # per scheduled request: does an EAGLE head read its rows
        if self.proposer is not None and self.proposer.needs_hidden:
            # The layer streams an EAGLE head reads, only in a step with a request it may
            # draft for: under `off` a step costs what it costs without a head.
            featured = [self.planner.may_draft(r, self.spec_policy) for r, _ in sched.scheduled]
            self.runner.aux_layers = self.proposer.aux_layers if any(featured) else ()
        t1 = time.perf_counter()
        hidden, logits = self.runner.execute(inputs,
                                             torch.tensor(logits_indices, dtype=torch.long),
                                             on_forward=on_forward,
                                             float32_logits=not _only_argmax(sampling))
        reqs = [r for r, _ in sampling]
        num_spec = [k for _, k in sampling]
        if self._grammar is not None and any(r.grammar is not None for r in reqs):
            self._grammar.mask(logits, sampling)
        # Logprobs are the model's own, as vLLM's default reports them: min_tokens' mask, the
        # token bans, the logit bias and the penalties decide what is sampled, not what the
        # model thought
        # (the grammar's mask does count).
        logprob_logits = logits.clone() if any(
            r.params.logprobs is not None and (r.processes_logits
                                               or r.params.min_tokens > r.num_output_tokens)
            for r in reqs) else logits
        mask_stops_before_min_tokens(logits, sampling)
        if any(r.processes_logits for r in reqs):
            apply_token_bans(logits, sampling)
            apply_penalties(logits, sampling)
        emitted = emit_tokens(logits, [r.params for r in reqs], [r.generator for r in reqs],
                              num_spec, [r.spec_token_ids for r in reqs],
                              [r.spec_probs for r in reqs])
        t_forward = time.perf_counter() - t1
        self.stats.forward_time += t_forward
        num_tokens = sched.total_num_tokens  # a sum over the batch: once per step
        if any(num_spec):
            self.stats.verify_time += time.perf_counter() - t1
        if scoring:  # after the forward's timing: the cost model prices forwards, not this
            self._score_prompts(hidden, scoring)
        computed_before = [req.num_computed_tokens for req, _ in sched.scheduled]
        for req, n in sched.scheduled:
            req.num_computed_tokens += n
        now = time.perf_counter()
        outputs = []
        row = 0
        iteration_tokens = 0  # vLLM's count (EngineStats.iteration_token_counts)
        shadow = self.planner.take_shadow() if self.planner else {}
        for (req, k), tokens in zip(sampling, emitted, strict=True):
            # The first unused guess (position k + 1) is checked against the token the target
            # emitted there, when it got there: after k accepted drafts (or with k = 0). Not
            # when the token budget cut the drafts short: the guess is for another position.
            guess = shadow.get(req.request_id) if shadow else None
            hit = None if guess is None or k != len(req.spec_token_ids) \
                or len(tokens) != k + 1 else tokens[k] == guess
            if k and req.spec_from_grammar:
                self._on_jump_forward_verified(req, k, len(tokens) - 1)
            elif k:
                self._on_verified(req, k, len(tokens) - 1, hit)
            elif hit is not None:  # an unused guess: would it have been accepted?
                self.spec_policy.observe_verification(req, 1, int(hit))
            if not k and req.spec_token_ids and not req.spec_from_grammar:
                # The token budget left room for no draft: the proposer still rolls its own
                # cache back past the guesses (a draft model's pool would otherwise keep KV of
                # a guess under the token emitted in its place, and could share it).
                self.proposer.on_verified(req, 0, 0)
            req.spec_token_ids, req.spec_probs = [], None
            itl = None if req.last_token_time is None else now - req.last_token_time
            req.last_token_time = now
            if req.first_token_time is None:
                req.first_token_time = now
                iteration_tokens += req.num_prompt_tokens
            if req.grammar is not None:
                if req.jump_forward_tail is not None:
                    self._grammar.observe_tail(req, tokens)
                self._grammar.accept_emitted(req, tokens)
            num_before = req.num_output_tokens
            self._append_and_check(req, tokens)
            num_new = req.num_output_tokens - num_before
            iteration_tokens += num_new
            if req.params.logprobs is not None:  # only for the tokens a stop left standing
                record_logprobs(req, logprob_logits[row:row + num_new], tokens[:num_new],
                                self._token_text)
            row += k + 1
            outputs.append(make_output(req, self.tokenizer, num_new, itl))
        for req, _ in sched.scheduled:
            if not req.is_finished:
                self.block_manager.cache_blocks(req)
        if self._grammar is not None and self.jump_forward_tokens:
            self._jump_forward()
        if self.proposer is not None:
            t_spec = time.perf_counter()
            if any(featured):
                self._hand_over_hidden(sched.scheduled, featured, computed_before,
                                       inputs.query_start, hidden)
            runs = [(c, n) for c, (_, n) in zip(computed_before, sched.scheduled, strict=True)]
            self.spec_policy.observe_step(num_tokens, t_forward,
                                          self.proposer.last_forwards,
                                          self.planner.last_propose_time, runs,
                                          num_tokens - len(logits_indices))
            self.proposer.last_forwards = []
            self.planner.propose(self.spec_policy)
            self.stats.spec_time += time.perf_counter() - t_spec
        stats = self.stats
        stats.num_steps += 1
        stats.step_token_counts[bisect.bisect_left(STEP_TOKEN_BUCKETS, num_tokens)] += 1
        stats.num_step_tokens += num_tokens
        stats.iteration_token_counts[
            bisect.bisect_left(STEP_TOKEN_BUCKETS, iteration_tokens)] += 1
        stats.num_iteration_tokens += iteration_tokens
        stats.step_time += time.perf_counter() - t0
        return outputs

    def _score_prompts(self, hidden: torch.Tensor, scoring: list[tuple[Request, int, int]]
                       ) -> None:
        """Record prompt logprobs from the final hidden rows that score them, through the LM
        head in slices of PROMPT_LOGPROBS_ROWS: a long prompt's fp32 logits never exist whole
        (512 rows x 128k ids would be 256 MB)."""
        model, h = self.runner.model, self.model_config.hidden_size
        for req, row, count in scoring:
            for start in range(row, row + count, PROMPT_LOGPROBS_ROWS):
                end = min(start + PROMPT_LOGPROBS_ROWS, row + count)
                # reduced where the logits are: only the top-k and ranks reach the host
                record_prompt_logprobs(req, model.compute_logits(hidden[start:end, :h]),
                                       self._token_text)

    def _hand_over_hidden(self, scheduled, featured: list[bool], computed_before: list[int],
                          query_start: list[int], hidden: torch.Tensor) -> None:
        """Give an EAGLE proposer the target's features of every position that stayed valid
        (rejected draft positions were rolled back already), for the requests it may draft
        for (featured)."""
        rows = [(req, before, start, req.num_computed_tokens - before)
                for (req, _), wanted, before, start in zip(scheduled, featured, computed_before,
                                                           query_start, strict=True)
                if wanted and not req.is_finished and req.num_computed_tokens > before]
        if rows:
            self.proposer.on_target_hidden(hidden, rows)

    def _on_verified(self, req: Request, num_draft: int, num_accepted: int,
                     next_guess_right: bool | None = None) -> None:
        """Roll the target's cache back past the rejected draft tokens. next_guess_right:
        whether a free proposer's unused guess for position num_draft + 1 equals the bonus
        token (None: no such guess, or a draft was rejected). The bonus token is the target's
        own choice there, so this is what verifying the guess would have given (for a point-
        mass guess under sampling too: P(bonus == guess) = p_target(guess), its acceptance
        rate); the policy learns it as one more draft position. Without it a position beyond
        the chosen K was never observed, and its estimate stayed where an earlier workload
        had left it (rag at concurrency 1 ran at K = 1 after prose and json: 0.88x static:4)."""
        req.num_computed_tokens -= num_draft - num_accepted
        req.num_draft_tokens += num_draft
        req.num_accepted_tokens += num_accepted
        self.stats.num_draft_tokens += num_draft
        self.stats.num_accepted_tokens += num_accepted
        self.stats.num_verifications += 1
        per_position = self.stats.accepted_per_position
        per_position.extend([0] * (num_accepted - len(per_position)))
        for j in range(num_accepted):
            per_position[j] += 1
        self.proposer.on_verified(req, num_draft, num_accepted)
        if next_guess_right is None:
            self.spec_policy.observe_verification(req, num_draft, num_accepted)
        else:
            self.spec_policy.observe_verification(req, num_draft + 1,
                                                  num_accepted + int(next_guess_right))

    def _on_jump_forward_verified(self, req: Request, num_draft: int, num_accepted: int) -> None:
        """Grammar-forced drafts were verified: roll back past the rejected ones. Neither the
        proposer (it never saw them), nor the policy's acceptance estimates, nor the draft
        counters (engine or request) hear of them: they are counted apart."""
        req.num_computed_tokens -= num_draft - num_accepted
        self.stats.num_jump_forward_tokens += num_draft
        self.stats.num_jump_forward_accepted += num_accepted

    def _jump_forward(self) -> None:
        """Draft what the grammar forces next for each decoding structured-output request,
        whatever the policy would choose: a forced draft is nearly always accepted (95-99% on
        the json workload's schemas), so it costs one row of the forward and saves a request a
        step, at any batch size. A request or engine whose policy is `off` drafts none, nor
        does a seeded sampled request (Request.drafts_nothing)."""
        policy = self.spec_policy.name if self.spec_policy else self.config.speculation_policy
        if policy == "off":
            return
        limit = self.jump_forward_tokens
        for req in self.scheduler.running:
            if (req.grammar is None or req.grammar_after is not None or req.spec_token_ids
                    or req.grammar.is_terminated()
                    or req.num_computed_tokens != req.num_tokens - 1
                    or req.params.speculation_policy == "off"
                    or req.drafts_nothing):
                continue
            cap = min(limit, draft_room(req, self.max_model_len))
            if req.params.num_speculative_tokens is not None:
                cap = min(cap, req.params.num_speculative_tokens)
            if cap > 0:
                tokens = self._grammar.forced_tokens(req, cap)
                if tokens:
                    req.spec_token_ids, req.spec_probs = tokens, None
                    req.spec_from_grammar = True

    def _free_spec_state(self, req: Request, preempted: bool = False) -> None:
        req.spec_token_ids, req.spec_probs = [], None
        req.jump_forward_tail = None
        if self.proposer is not None:
            if preempted:
                self.proposer.on_preempted(req)
            else:
                self.proposer.free(req)
            if req.is_finished:
                self.spec_policy.forget(req)
                self.planner.forget(req.request_id)

    def _append_and_check(self, req: Request, tokens: list[int]) -> None:
        """Append newly emitted tokens one by one, stopping at the first stop condition (later
        accepted draft tokens are dropped)."""
        for token in tokens:
            req.append_token(token)
            self.stats.num_generated_tokens += 1
            status = check_stop(req, token, self.tokenizer, self.model_config.eos_token_ids)
            if status is not None:
                return self._finish(req, status)

    def _finish(self, req: Request, status: RequestStatus) -> None:
        req.finished_time = time.perf_counter()
        # Cache what it computed before freeing: a request that finishes in the step that
        # prefilled it (max_tokens=1, an early stop) would otherwise leave no prefix behind.
        self.block_manager.cache_blocks(req)
        self.scheduler.finish(req, status)
        self._free_spec_state(req)
        self.requests.pop(req.request_id, None)

    def get_stats(self) -> dict:
        bm = self.block_manager
        s = self.stats
        return {
            "num_steps": s.num_steps,
            "num_prompt_tokens": s.num_prompt_tokens,
            "num_generated_tokens": s.num_generated_tokens,
            "num_preemptions": s.num_preemptions,
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "kv_blocks_total": bm.num_blocks,
            "kv_blocks_free": bm.num_free_blocks,
            "kv_cache_usage": bm.usage,
            "prefix_cache_queries": bm.num_prefix_queries,
            "prefix_cache_hits": bm.num_prefix_hits,
            "weight_bytes": self.weight_bytes,
            "kv_cache_bytes": self.runner.kv_cache_bytes,
            "kv_cache_dtype": str(self.runner.kv_caches[0].dtype).replace("torch.", ""),
            "max_concurrent_1k_seqs": bm.num_blocks * bm.block_size // 1024,
            "forward_time_s": s.forward_time,
            "step_time_s": s.step_time,
            "step_token_counts": list(s.step_token_counts),
            "iteration_token_counts": list(s.iteration_token_counts),
            "num_iteration_tokens": s.num_iteration_tokens,
            "num_step_tokens": s.num_step_tokens,
            **self.spec_stats(),
        }

    def spec_stats(self) -> dict:
        s = self.stats
        p = self.proposer
        return {
            "spec_method": p.name if p else None,
            "num_draft_tokens": s.num_draft_tokens,
            "num_accepted_tokens": s.num_accepted_tokens,
            "num_verifications": s.num_verifications,
            "accepted_per_position": list(s.accepted_per_position),
            "acceptance_rate": s.num_accepted_tokens / s.num_draft_tokens
            if s.num_draft_tokens else None,
            # tokens emitted per verification: accepted + the recovered/bonus token
            "mean_accepted_length": (s.num_accepted_tokens + s.num_verifications)
            / s.num_verifications if s.num_verifications else None,
            "draft_time_s": s.draft_time,
            "verify_time_s": s.verify_time,
            "spec_time_s": s.spec_time,
            "num_jump_forward_tokens": s.num_jump_forward_tokens,
            "num_jump_forward_accepted": s.num_jump_forward_accepted,
            "draft_weight_bytes": p.weight_bytes if p else 0,
            "draft_kv_cache_bytes": p.kv_cache_bytes if p else 0,
            "draft_num_forwards": getattr(p, "num_forwards", 0),
            # prompt and output tokens a draft model's KV pool served from its prefix cache
            "draft_prefix_cache_hits": getattr(p, "num_prefix_hit_tokens", 0),
            # suffix decoding: the replies of finished requests it guesses from
            "suffix_cached_replies": getattr(p, "num_cached_replies", 0),
            "suffix_cached_tokens": getattr(p, "num_cached_tokens", 0),
            **(self.spec_policy.stats(self.scheduler.running) if self.spec_policy else {}),
        }


def _only_argmax(sampling: list[tuple[Request, int]]) -> bool:
    """Whether this step reads nothing of its logits but each row's argmax: every sampling
    request greedy, without logprobs, penalties or logit bias, grammar, or a min_tokens mask
    still to apply. Then the logits stay in the LM head's dtype: widening bf16 to fp32 is exact,
    so the argmax is the same, and the copy (12 MB at 64 rows) is skipped."""
    return all(r.params.is_greedy and r.params.logprobs is None and not r.processes_logits
               and r.grammar is None and r.params.min_tokens <= r.num_output_tokens
               for r, _ in sampling)


def _same_path(a: str, b: str) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
