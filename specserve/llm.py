"""The offline API in vLLM's shape: `LLM(...).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import fields, replace
from typing import Any

from rich.progress import MofNCompleteColumn, Progress

from specserve.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams, advance_all
from specserve.config import CacheConfig, EngineConfig, SchedulerConfig
from specserve.engine.llm_engine import LLMEngine
from specserve.engine.prompts import encode_prompt, render_chat
from specserve.lora.request import LoRARequest
from specserve.outputs import RequestOutput
from specserve.sampling_params import SamplingParams

# vLLM's PromptType: text, token ids, or a TextPrompt / TokensPrompt dict.
PromptType = str | list[int] | dict[str, Any]

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

    def get_default_sampling_params(self) -> SamplingParams:
        """What `generate` and `chat` use without SamplingParams: the engine's defaults with the
        model's generation_config.json applied (vLLM's `--generation-config auto`)."""
        return self.engine.default_sampling_params()

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 *, use_tqdm: bool = False, priority: Sequence[int] | None = None,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None
                 ) -> list[RequestOutput]:
        """Run all prompts to completion in one continuous batch; outputs keep input order.
        Prompts are strings, lists of token ids, or vLLM's prompt dicts ({"prompt": text} or
        {"prompt_token_ids": ids}); use_tqdm shows a progress bar of finished requests, as
        vLLM's does (off by default here). With `n` > 1 a prompt's RequestOutput holds
        n completions (`outputs[j].index == j`), each run as its own engine request (see
        SamplingParams.for_choice); with prefix caching, a prompt of 256 tokens or more is
        prefilled once for all of them (each choice computes its last partial block).
        priority: one per prompt, as vLLM's (an engine with scheduling_policy="priority" runs
        lower values first). lora_request: a LoRA adapter for every prompt, or one (or None) per
        prompt, as vLLM's (an engine with enable_lora=True)."""
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or self.get_default_sampling_params()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("need one SamplingParams per prompt, or a single one")
        try:
            priority = [0] * len(prompts) if priority is None else list(priority)
        except TypeError:
            raise ValueError("priority: one integer per prompt") from None
        if len(priority) != len(prompts):
            raise ValueError("need one priority per prompt")
        loras = _per_prompt_loras(lora_request, len(prompts))
        params = [_salted(p, sp) for p, sp in zip(prompts, params, strict=True)]
        prompts = [_prompt_input(p) for p in prompts]
        for sp in params:  # refuse bad input before anything is queued
            sp.validate()
        groups: list[list[str]] = []
        try:
            for p, sp, prio, lora in zip(prompts, params, priority, loras, strict=True):
                groups.append([])
                for j in range(sp.n):
                    groups[-1].append(self.engine.add_request(
                        p, sp.for_choice(j), priority=prio, lora_request=lora).request_id)
        except BaseException:  # all or none
            for rid in (r for g in groups for r in g):
                self.engine.abort_request(rid)
            raise
        outs = iter(self._run([rid for g in groups for rid in g], use_tqdm))
        return [_merge_choices([next(outs) for _ in g]) for g in groups]

    def beam_search(self, prompts: PromptType | Sequence[PromptType], params: BeamSearchParams,
                    *, lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None
                    ) -> list[BeamSearchOutput]:
        """vLLM's LLM.beam_search: each prompt's params.beam_width best sequences, best first
        (specserve/beam_search.py). The beams of all prompts are scored together, one step at a
        time; a prompt and its max_tokens must fit the context. lora_request as generate's."""
        params.validate()
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        loras = _per_prompt_loras(lora_request, len(prompts))
        tokenizer = self.engine.tokenizer
        searches, salts = [], []
        for p in prompts:
            ids = _prompt_input(p)
            ids = encode_prompt(tokenizer, ids) if isinstance(ids, str) else ids
            if len(ids) + params.max_tokens > self.engine.max_model_len:
                raise ValueError(f"a prompt of {len(ids)} tokens and max_tokens "
                                 f"{params.max_tokens} do not fit the maximum context, "
                                 f"{self.engine.max_model_len} tokens")
            searches.append(BeamSearch(ids, params, self.engine.model_config.eos_token_ids))
            salts.append(p.get("cache_salt") if isinstance(p, dict) else None)
        while live := [i for i, s in enumerate(searches) if not s.done]:
            request_ids: list[str] = []
            try:
                for i in live:
                    step = replace(searches[i].step_params(), cache_salt=salts[i])
                    request_ids += [self.engine.add_request(ids, step,
                                                            lora_request=loras[i]).request_id
                                    for ids in searches[i].pending()]
            except BaseException:
                for rid in request_ids:
                    self.engine.abort_request(rid)
                raise
            advance_all([searches[i] for i in live],
                        [out.outputs[0].logprobs[0] for out in self._run(request_ids)])
        return [s.result(tokenizer) for s in searches]

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | None = None, *, use_tqdm: bool = False,
             add_generation_prompt: bool = True, continue_final_message: bool = False,
             chat_template_kwargs: dict | None = None,
             tools: list[dict] | None = None,
             lora_request: LoRARequest | None = None) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"}) or a list of conversations, rendered
        with the model's chat template as the server renders it (vLLM's options: the
        assistant's header, or the last assistant message left open to be continued; the
        template's own variables; OpenAI's function tools, for a template that lists them).
        Each output's `prompt` is the rendered text, as vLLM's."""
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        tokenizer = self.engine.tokenizer
        texts = [render_chat(tokenizer, c, add_generation_prompt=add_generation_prompt,
                             continue_final_message=continue_final_message, tools=tools,
                             template_kwargs=chat_template_kwargs) for c in convs]
        # Token ids with no special tokens added: the template wrote its own (a raw text prompt
        # would get a second BOS on Llama and Mistral).
        outs = self.generate([{"prompt_token_ids": encode_prompt(tokenizer, t,
                                                                 add_special_tokens=False)}
                              for t in texts], sampling_params, use_tqdm=use_tqdm,
                             lora_request=lora_request)
        for out, text in zip(outs, texts, strict=True):
            out.prompt = text
        return outs

    def generate_stream(self, prompt: PromptType, sampling_params: SamplingParams | None = None,
                        lora_request: LoRARequest | None = None) -> Iterator[RequestOutput]:
        """Yield the growing output of one request after every step that extends it (a prompt
        as `generate` takes one). While a stop string could still match, the text's last
        len(stop) - 1 characters are held back (as vLLM and the server do): a match cuts the
        text where it begins, which may be text a step already produced."""
        params = _salted(prompt, sampling_params or self.get_default_sampling_params())
        req = self.engine.add_request(_prompt_input(prompt), params, stream=True,
                                      lora_request=lora_request)
        holdback = max(map(len, req.params.stop), default=1) - 1
        shown = 0  # characters of the text yielded so far
        try:
            while True:
                for out in self.engine.step():
                    if out.request_id == req.request_id:
                        text = out.outputs[0].text
                        if holdback and not out.finished:
                            text = out.outputs[0].text = text[:max(len(text) - holdback, 0)]
                        # What this output adds to the text shown before it (the deltas join
                        # to the final text; a stop match only ever cuts held-back text).
                        out.delta_text, shown = text[shown:], len(text)
                        yield out
                        if out.finished:
                            return
        finally:
            self.engine.abort_request(req.request_id)

    def _run(self, request_ids: list[str], use_tqdm: bool = False) -> list[RequestOutput]:
        pending = set(request_ids)
        done: dict[str, RequestOutput] = {}
        progress = Progress(*Progress.get_default_columns(), MofNCompleteColumn(),
                            disable=not use_tqdm, transient=True)
        try:
            with progress:
                task = progress.add_task("generating", total=len(request_ids))
                while pending:
                    for out in self.engine.step():
                        if out.finished and out.request_id in pending:
                            done[out.request_id] = out
                            pending.discard(out.request_id)
                            progress.advance(task)
        finally:
            for rid in pending:  # interrupted: leave nothing behind in the engine
                self.engine.abort_request(rid)
        return [done[r] for r in request_ids]

    def get_stats(self) -> dict:
        return self.engine.get_stats()


def _prompt_input(prompt: PromptType) -> str | list[int]:
    """vLLM's prompt forms: text, token ids, {"prompt": text}, {"prompt_token_ids": ids} (a
    dict may add "cache_salt": _salted)."""
    if not isinstance(prompt, dict):
        return prompt
    unknown = set(prompt) - {"prompt", "prompt_token_ids", "cache_salt"}
    if unknown:  # e.g. multi_modal_data: refused rather than silently dropped
        raise ValueError(f"prompt dict keys {sorted(unknown)} are not supported; give "
                         "'prompt' or 'prompt_token_ids'")
    if "prompt_token_ids" in prompt:
        return list(prompt["prompt_token_ids"])
    if "prompt" in prompt:
        return prompt["prompt"]
    raise ValueError(f"a prompt dict needs 'prompt' or 'prompt_token_ids', got {sorted(prompt)}")


def _salted(prompt: PromptType, params: SamplingParams) -> SamplingParams:
    """params with the prompt dict's cache_salt (vLLM's key), if it has one."""
    salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
    return params if salt is None else replace(params, cache_salt=salt)


def _merge_choices(outs: list[RequestOutput]) -> RequestOutput:
    """The n engine requests of one prompt as one RequestOutput, as vLLM returns it. Its
    request_id and metrics are choice 0's; generate merges only finished requests."""
    if len(outs) == 1:
        return outs[0]
    choices = [replace(o.outputs[0], index=j) for j, o in enumerate(outs)]
    return replace(outs[0], outputs=choices, finished=True,
                   delta_text="", delta_token_ids=[])


def _per_prompt_loras(lora_request: LoRARequest | Sequence[LoRARequest | None] | None,
                      num_prompts: int) -> list[LoRARequest | None]:
    """One adapter (or None) per prompt: a list gives each its own, a single one all."""
    loras = (list(lora_request) if isinstance(lora_request, (list, tuple))
             else [lora_request] * num_prompts)
    if len(loras) != num_prompts:
        raise ValueError("need one lora_request per prompt, or a single one")
    if bad := [x for x in loras if x is not None and not isinstance(x, LoRARequest)]:
        raise ValueError(f"lora_request must be a LoRARequest, not {bad[0]!r}")
    return loras
