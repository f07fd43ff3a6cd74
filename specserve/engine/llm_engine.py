"""The engine loop: add requests, step (schedule -> forward -> sample -> update), stream outputs."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from specserve.config import EngineConfig, parse_dtype
from specserve.engine.block_manager import BlockManager
from specserve.engine.detokenizer import detokenize_incrementally, find_stop_string
from specserve.engine.model_runner import ModelRunner, kv_bytes_per_token
from specserve.engine.request import Request, RequestStatus
from specserve.engine.scheduler import Scheduler
from specserve.models.llama import build_model
from specserve.models.loader import load_model
from specserve.outputs import CompletionOutput, RequestMetrics, RequestOutput
from specserve.sample.sampler import sample
from specserve.sampling_params import SamplingParams


@dataclass(slots=True)
class EngineStats:
    num_steps: int = 0
    num_prompt_tokens: int = 0  # prompt tokens computed (prefix-cache hits excluded)
    num_generated_tokens: int = 0
    num_preemptions: int = 0
    forward_time: float = 0.0  # seconds in model forwards
    step_time: float = 0.0  # seconds in step() overall


def _available_memory() -> int:
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
        self.model_name = loaded.name
        self.tokenizer = loaded.tokenizer
        self.dtype = config.torch_dtype
        self.model = build_model(cfg, loaded.state_dict, self.dtype)
        self.weight_bytes = sum(p.nbytes for p in self.model.parameters())
        cache = config.cache
        kv_dtype = (self.dtype if cache.kv_cache_dtype == "auto"
                    else parse_dtype(cache.kv_cache_dtype))
        block_bytes = cache.block_size * kv_bytes_per_token(cfg, kv_dtype)
        budget = cache.kv_cache_memory
        if isinstance(budget, float):
            budget = int(budget * _available_memory())
        num_blocks = cache.num_blocks or max(budget // block_bytes, 1)
        self.runner = ModelRunner(self.model, cfg, cache, num_blocks, kv_dtype)
        self.block_manager = BlockManager(num_blocks, cache.block_size, cache.enable_prefix_caching)
        self.scheduler = Scheduler(config.scheduler, self.block_manager)
        self.max_model_len = min(cfg.max_position, num_blocks * cache.block_size)
        self.requests: dict[str, Request] = {}
        self.stats = EngineStats()
        self.load_time = time.perf_counter() - t0
        self._next_id = 0

    # ---- requests -------------------------------------------------------------------------
    def tokenize(self, prompt: str) -> list[int]:
        return self.tokenizer(prompt, add_special_tokens=False).input_ids

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True)
        return self.tokenize(text)

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, stream: bool = False) -> Request:
        """Validate and queue a request. Raises ValueError for bad input; nothing else changes."""
        params = params or SamplingParams()
        params.validate()
        if isinstance(prompt, str):
            prompt_text, token_ids = prompt, self.tokenize(prompt)
        else:
            prompt_text, token_ids = None, list(prompt)
        if not token_ids:
            raise ValueError("the prompt is empty")
        if any(not isinstance(t, int) or not 0 <= t < self.model_config.vocab_size
               for t in token_ids):
            raise ValueError(f"prompt token ids must be in [0, {self.model_config.vocab_size})")
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
        req.stream = stream or bool(params.stop)
        self.requests[request_id] = req
        self.scheduler.add_request(req)
        return req

    def abort_request(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None and not req.is_finished:
            self.scheduler.finish(req, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the loop ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One iteration: schedule, run one forward over the whole batch, sample, update.
        Returns an output for every request that produced tokens or finished."""
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        self.stats.num_preemptions += sched.num_preempted
        if not sched.scheduled:
            return []
        inputs = self.runner.prepare(sched.scheduled)
        sampling_reqs: list[Request] = []
        logits_indices: list[int] = []
        for i, (req, n) in enumerate(sched.scheduled):
            if req.num_computed_tokens + n >= req.num_tokens:  # reaches the last known token
                sampling_reqs.append(req)
                logits_indices.append(inputs.query_start[i] + n - 1)
            if req.num_computed_tokens < req.num_prompt_tokens:
                self.stats.num_prompt_tokens += min(n, req.num_prompt_tokens
                                                    - req.num_computed_tokens)
        t1 = time.perf_counter()
        _, logits = self.runner.execute(inputs, torch.tensor(logits_indices, dtype=torch.long))
        token_ids = self._sample(sampling_reqs, logits)
        self.stats.forward_time += time.perf_counter() - t1
        for req, n in sched.scheduled:
            req.num_computed_tokens += n
            self.block_manager.cache_blocks(req)
        now = time.perf_counter()
        outputs = []
        for req, token in zip(sampling_reqs, token_ids, strict=True):
            if req.first_token_time is None:
                req.first_token_time = now
            self._append_and_check(req, [token])
            outputs.append(self._make_output(req, 1))
        self.stats.num_steps += 1
        self.stats.step_time += time.perf_counter() - t0
        return outputs

    def _sample(self, reqs: list[Request], logits: torch.Tensor) -> list[int]:
        params = [r.params for r in reqs]
        temperature = torch.tensor([p.temperature for p in params])
        top_k = torch.tensor([p.top_k for p in params]) if any(p.top_k for p in params) else None
        top_p = (torch.tensor([p.top_p for p in params])
                 if any(p.top_p < 1 for p in params) else None)
        tokens = sample(logits, temperature, top_k, top_p, [r.generator for r in reqs])
        token_list = tokens.tolist()
        if any(p.logprobs is not None for p in params):
            logprobs = logits.log_softmax(dim=-1)
            for i, req in enumerate(reqs):
                if req.params.logprobs is None:
                    continue
                lp = logprobs[i]
                entry = {token_list[i]: float(lp[token_list[i]])}
                if req.params.logprobs:
                    top = lp.topk(req.params.logprobs)
                    entry.update(zip(top.indices.tolist(), top.values.tolist(), strict=True))
                req.logprobs.append(entry)
                req.cumulative_logprob += entry[token_list[i]]
        return token_list

    def _append_and_check(self, req: Request, tokens: list[int]) -> None:
        """Append newly emitted tokens one by one, stopping at the first stop condition."""
        for token in tokens:
            req.append_token(token)
            self.stats.num_generated_tokens += 1
            if token in req.stop_token_ids and req.num_output_tokens > req.params.min_tokens:
                req.stop_reason = None if token in self.model_config.eos_token_ids else token
                return self._finish(req, RequestStatus.FINISHED_STOPPED)
            if req.stream:
                delta = detokenize_incrementally(self.tokenizer, req)
                if delta and req.params.stop:
                    end = find_stop_string(req, len(delta))
                    if end is not None:
                        req.output_text = req.output_text[:end]
                        return self._finish(req, RequestStatus.FINISHED_STOPPED)
            if req.num_output_tokens >= req.max_tokens:
                return self._finish(req, RequestStatus.FINISHED_LENGTH)

    def _finish(self, req: Request, status: RequestStatus) -> None:
        req.finished_time = time.perf_counter()
        self.scheduler.finish(req, status)
        self.requests.pop(req.request_id, None)

    def _make_output(self, req: Request, num_new: int) -> RequestOutput:
        finished = req.is_finished
        if req.stream:
            text = req.output_text
        else:
            text = (self.tokenizer.decode(req.output_token_ids,
                                          skip_special_tokens=req.params.skip_special_tokens)
                    if finished else "")
        completion = CompletionOutput(
            index=0, text=text, token_ids=list(req.output_token_ids),
            cumulative_logprob=req.cumulative_logprob if req.params.logprobs is not None else None,
            logprobs=list(req.logprobs) if req.params.logprobs is not None else None,
            finish_reason=req.finish_reason, stop_reason=req.stop_reason)
        metrics = RequestMetrics(req.arrival_time, req.first_token_time, req.finished_time,
                                 req.num_cached_tokens, req.num_preemptions)
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, [completion],
                             finished, metrics, delta_token_ids=req.output_token_ids[-num_new:])

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
            "forward_time_s": s.forward_time,
            "step_time_s": s.step_time,
        }


def default_threads() -> int:
    return len(os.sched_getaffinity(0))
