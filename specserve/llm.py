"""The offline API in vLLM's shape: `LLM(...).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import fields, replace

from specserve.config import CacheConfig, EngineConfig, SchedulerConfig
from specserve.engine.llm_engine import LLMEngine
from specserve.outputs import RequestOutput
from specserve.sampling_params import SamplingParams

_CACHE_KEYS = {f.name for f in fields(CacheConfig)}
_SCHED_KEYS = {f.name for f in fields(SchedulerConfig)}


def build_engine_config(model: str | None = None, **kwargs) -> EngineConfig:
    """Split flat keyword arguments (as vLLM's `LLM(...)` takes them) into the config tree."""
    cache = {k: kwargs.pop(k) for k in list(kwargs) if k in _CACHE_KEYS}
    sched = {k: kwargs.pop(k) for k in list(kwargs) if k in _SCHED_KEYS}
    known = {f.name for f in fields(EngineConfig)} - {"cache", "scheduler", "model"}
    unknown = set(kwargs) - known
    if unknown:
        raise ValueError(f"unknown engine arguments: {sorted(unknown)}")
    return EngineConfig(model=model, cache=CacheConfig(**cache),
                        scheduler=SchedulerConfig(**sched), **kwargs)


class LLM:
    """An engine plus a blocking loop. `LLM()` loads the embedded SmolLM2-135M-Instruct."""

    def __init__(self, model: str | None = None, **kwargs):
        self.engine = LLMEngine(build_engine_config(model, **kwargs))

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: str | Sequence[str] | Sequence[list[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 ) -> list[RequestOutput]:
        """Run all prompts to completion in one continuous batch; outputs keep input order.
        Prompts are strings or lists of token ids. With `n` > 1 a prompt's RequestOutput holds
        n completions (`outputs[j].index == j`), each run as its own engine request (see
        SamplingParams.for_choice); with prefix caching, a prompt of 256 tokens or more is
        prefilled once for all of them (each choice computes its last partial block)."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("need one SamplingParams per prompt, or a single one")
        for sp in params:  # refuse bad input before anything is queued
            sp.validate()
        groups: list[list[str]] = []
        try:
            for p, sp in zip(prompts, params, strict=True):
                groups.append([])
                for j in range(sp.n):
                    groups[-1].append(self.engine.add_request(p, sp.for_choice(j)).request_id)
        except BaseException:  # all or none
            for rid in (r for g in groups for r in g):
                self.engine.abort_request(rid)
            raise
        outs = iter(self._run([rid for g in groups for rid in g]))
        return [_merge_choices([next(outs) for _ in g]) for g in groups]

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | None = None) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"}) or a list of conversations, rendered
        with the model's chat template."""
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.engine.apply_chat_template(c) for c in convs]
        return self.generate(prompts, sampling_params)

    def generate_stream(self, prompt: str | list[int], sampling_params: SamplingParams | None = None
                        ) -> Iterator[RequestOutput]:
        """Yield the growing output of one request after every step that extends it."""
        req = self.engine.add_request(prompt, sampling_params, stream=True)
        try:
            while True:
                for out in self.engine.step():
                    if out.request_id == req.request_id:
                        yield out
                        if out.finished:
                            return
        finally:
            self.engine.abort_request(req.request_id)

    def _run(self, request_ids: list[str]) -> list[RequestOutput]:
        pending = set(request_ids)
        done: dict[str, RequestOutput] = {}
        try:
            while pending:
                for out in self.engine.step():
                    if out.finished and out.request_id in pending:
                        done[out.request_id] = out
                        pending.discard(out.request_id)
        finally:
            for rid in pending:  # interrupted: leave nothing behind in the engine
                self.engine.abort_request(rid)
        return [done[r] for r in request_ids]

    def get_stats(self) -> dict:
        return self.engine.get_stats()


def _merge_choices(outs: list[RequestOutput]) -> RequestOutput:
    """The n engine requests of one prompt as one RequestOutput, as vLLM returns it. Its
    request_id and metrics are choice 0's."""
    if len(outs) == 1:
        return outs[0]
    choices = [replace(o.outputs[0], index=j) for j, o in enumerate(outs)]
    return replace(outs[0], outputs=choices, finished=all(o.finished for o in outs),
                   delta_text="", delta_token_ids=[])
