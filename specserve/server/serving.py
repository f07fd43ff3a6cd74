"""The OpenAI endpoints' logic: request -> engine requests -> JSON response or SSE stream.

One API request fans out to one engine request per (prompt, choice); their outputs come back
through one OutputStream, tagged with the choice index. Whatever way a response ends (done, the
client hung up, the server is stopping) the stream is closed, which aborts the engine requests
still running so that their KV blocks are freed before the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import functools
import os
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from specserve.beam_search import BeamSearch, advance_all
from specserve.engine.detokenizer import decode, token_bytes
from specserve.engine.prompts import encode_chat, encode_prompt, truncate_prompt
from specserve.lora.request import LoRARequest
from specserve.outputs import RequestOutput
from specserve.sampling_params import SamplingParams
from specserve.server.async_engine import (
    AsyncEngine,
    EngineClosedError,
    EngineDeadError,
    OutputStream,
    QueueFullError,
)
from specserve.server.errors import APIError
from specserve.server.metrics import ServerMetrics
from specserve.server.protocol import (
    ChatChoice,
    ChatChoiceLogprobs,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatResponseMessage,
    ChatStreamChoice,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    DetokenizeRequest,
    DetokenizeResponse,
    FunctionCall,
    LoadLoRAAdapterRequest,
    PromptLogprob,
    PromptLogprobs,
    PromptTokensDetails,
    TokenizeRequest,
    TokenizeResponse,
    TokenLogprob,
    ToolCall,
    TopLogprob,
    UnloadLoRAAdapterRequest,
    UsageInfo,
)
from specserve.server.reasoning import REASONING_PARSERS, ReasoningReader
from specserve.server.replies import ReplyReader, reply_reader
from specserve.server.response_events import ResponseEvents, response_events, whole_response
from specserve.server.responses import ResponsesRequest
from specserve.server.streaming import (
    DeltaTracker,
    EventStreamResponse,
    TextChunk,
    TextOffsets,
    collect_outputs,
)
from specserve.server.tool_calls import merge_calls, new_id

# nginx's code for "client closed request": never seen by the client, only in access logs.
_CLIENT_CLOSED = 499
# Prompts longer than this (characters) are tokenized off the event loop: ~5k tokens take a few
# ms, which the streams can wait; a 10 MB prompt takes seconds, which they must not.
TOKENIZE_INLINE_CHARS = 20_000
_T = TypeVar("_T")


class OpenAIServing:
    """The OpenAI endpoints (completions, chat completions, responses) and vLLM's tokenizer
    endpoints over an AsyncEngine."""

    def __init__(self, engine: AsyncEngine, model_name: str,
                 metrics: ServerMetrics | None = None, aliases: tuple[str, ...] = (),
                 tool_call_parser: str | None = None, reasoning_parser: str | None = None,
                 loras: dict[str, LoRARequest] | None = None):
        self.engine = engine
        # LoRA adapters served beside the base model, by the name a request's `model` gives
        # (vLLM's --lora-modules), already loaded into the engine.
        self.loras = loras or {}
        # The last id given to an adapter: ids only grow, so a request still on its way to the
        # engine for an unloaded adapter can never find another one under its id.
        self._lora_ids = max([0, *(r.lora_int_id for r in self.loras.values())])
        self._loading: set[str] = set()  # names whose adapters are being read
        # Beam searches running per adapter id: a search's every step is a new engine request,
        # so the engine keeps an adapter unloaded meanwhile until the last search with it ends
        # (a running request keeps its weights too).
        self._searching: Counter[int] = Counter()
        self.model_name = model_name
        # How tool_choice "auto" reads the model's calls (None: such requests are refused),
        # and how a reply's reasoning is told from its answer (None: it is not).
        self.tool_call_parser = tool_call_parser
        self.reasoning_parser = reasoning_parser
        # Other names a request may use for it: the model argument as the server was started
        # with it (vLLM's default served name, a path; ours is its last part).
        self._names = {model_name, *aliases}
        self.metrics = metrics
        self.max_model_len = engine.engine.max_model_len
        cache = engine.engine.config.cache
        self._cache_block = cache.block_size if cache.enable_prefix_caching else None
        self._defaults = engine.engine.default_sampling_params()
        # The model's max_new_tokens, if its generation_config.json sets one: vLLM caps every
        # request's output with it.
        self._max_tokens_cap = engine.engine.sampling_defaults.get("max_tokens")
        # The front end's own copy of the tokenizer (the engine thread keeps the original for
        # detokenization), so that prompts are tokenized here, on the event loop, as vLLM's API
        # server does: a request then reaches the engine in one hop instead of waiting for a
        # step boundary to tokenize and another to be added (measured: ~1 step of the batch
        # running one request short, every time a request is replaced).
        self._tokenizer = copy.deepcopy(engine.engine.tokenizer)
        # Long prompts go to one worker thread with a tokenizer of its own (a fast tokenizer
        # must not be used by two threads at once), as vLLM tokenizes off its event loop.
        self._worker_tokenizer = copy.deepcopy(engine.engine.tokenizer)
        self._tokenize_pool = ThreadPoolExecutor(1, thread_name_prefix="specserve-tokenize")
        self._token_text = functools.lru_cache(maxsize=1 << 16)(self._decode_token)
        self._token_bytes = functools.lru_cache(maxsize=1 << 16)(
            functools.partial(token_bytes, self._tokenizer))
        # What skip_special_tokens leaves out of the text: every added token marked special
        # (all_special_ids names only the few with a role, 3 of SmolLM2's 17).
        self._special_ids = frozenset(self._tokenizer.all_special_ids) | frozenset(
            i for i, t in getattr(self._tokenizer, "added_tokens_decoder", {}).items()
            if t.special)

    async def _tokenize(self, work: Callable[[Any], _T], num_chars: int) -> _T:
        """work(tokenizer): on the event loop for an ordinary prompt, on the worker thread for
        one of more than TOKENIZE_INLINE_CHARS characters."""
        if num_chars <= TOKENIZE_INLINE_CHARS:
            return work(self._tokenizer)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenize_pool, work, self._worker_tokenizer)

    def _truncation(self, k: int | None) -> int | None:
        """truncate_prompt_tokens as a token count (-1: the model's context)."""
        return self.max_model_len if k == -1 else k

    def _capped(self, max_tokens: int | None) -> int | None:
        cap = self._max_tokens_cap
        return max_tokens if cap is None else min(cap, max_tokens or cap)

    # ---- endpoints ----------------------------------------------------------------------------
    async def completions(self, req: CompletionRequest, raw: Request) -> Response:
        lora = self.check_model(req.model)
        self._check_priority(req.priority)
        with _refused_as_400():
            prompts = req.prompts()
            prompt_ids = await self._tokenize(
                lambda tok: [encode_prompt(tok, p, req.add_special_tokens)
                             if isinstance(p, str) else list(p) for p in prompts],
                sum(len(p) for p in prompts if isinstance(p, str)))
            if (k := self._truncation(req.truncate_prompt_tokens)) is not None:
                # A text keeps the special tokens encoding added (a BOS); a cut one is echoed
                # as the text of the tokens kept, special tokens included, as a text's are.
                added = self._tokenizer if req.add_special_tokens else None
                kept = [truncate_prompt(ids, k, added if isinstance(p, str) else None)
                        for p, ids in zip(prompts, prompt_ids, strict=True)]
                prompts = [decode(self._tokenizer, new) if isinstance(p, str) and new != ids
                           else p for p, ids, new in zip(prompts, prompt_ids, kept, strict=True)]
                prompt_ids = kept
            max_tokens = 1 if req.echo_only else self._capped(req.max_tokens)
            for ids in prompt_ids:
                self._check_length(len(ids), max_tokens)
            params = req.to_sampling_params(max_tokens, req.logprobs, self._defaults)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        num_prompt_tokens = sum(len(ids) for ids in prompt_ids)
        echo = self._echo(req, prompts, prompt_ids) if req.echo else None
        if req.use_beam_search:
            outputs = await self._beam_search(request_id, prompt_ids, req, max_tokens, lora, raw)
        else:
            stream = await self._submit(request_id, prompt_ids, params, req.n, req.stream,
                                       req.priority, lora)
            if req.stream:
                events = self._completion_events(request_id, req, stream, prompt_ids, echo)
                return EventStreamResponse(events, stream)
            outputs = await collect_outputs(stream, raw)
        if outputs is None:
            return Response(status_code=_CLIENT_CLOSED)
        choices = []
        if req.echo_only:  # the one token generated is not part of the answer
            outputs = [_without_completion(out) for out in outputs]
        for i, out in enumerate(outputs):
            c = out.outputs[0]
            # Choice 0 of each prompt scored it (SamplingParams.for_choice).
            scores = outputs[i - i % req.n].prompt_logprobs
            text, logprobs = c.text, None
            if c.logprobs is not None:
                logprobs = CompletionLogprobs()
                offsets = TextOffsets()
                if echo is not None:
                    self._completion_logprobs(out.prompt_token_ids, scores, offsets,
                                              echo.skip_special[i // req.n], logprobs,
                                              req.return_tokens_as_token_ids)
                self._completion_logprobs(c.token_ids, c.logprobs, offsets,
                                          req.skip_special_tokens, logprobs,
                                          req.return_tokens_as_token_ids)
            if echo is not None:
                text = echo.texts[i // req.n] + text
            choices.append(CompletionChoice(
                index=i, text=text, logprobs=logprobs, finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
                prompt_logprobs=self._prompt_logprobs(scores, req.prompt_logprobs)))
        body = CompletionResponse(id=request_id, model=self.served_name(req), choices=choices,
                                  usage=_usage(num_prompt_tokens, outputs, req.n))
        return _json(body)

    async def chat(self, req: ChatCompletionRequest, raw: Request) -> Response:
        lora = self.check_model(req.model)
        self._check_priority(req.priority)
        prompt_ids, params, reasoning_reader = await self._chat_prompt(req)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        if req.use_beam_search:
            outputs = await self._beam_search(request_id, [prompt_ids], req,
                                              self._capped(req.output_limit), lora, raw)
        else:
            stream = await self._submit(request_id, [prompt_ids], params, req.n, req.stream,
                                       req.priority, lora)
            if req.stream:
                events = self._chat_events(request_id, req, params, reasoning_reader, stream,
                                           len(prompt_ids))
                return EventStreamResponse(events, stream)
            outputs = await collect_outputs(stream, raw)
        if outputs is None:
            return Response(status_code=_CLIENT_CLOSED)
        choices = []
        for i, out in enumerate(outputs):
            c = out.outputs[0]
            logprobs = (None if c.logprobs is None
                        else self._chat_logprobs(c.token_ids, c.logprobs, req.top_logprobs or 0,
                                                 req.return_tokens_as_token_ids))
            message, finish_reason = ChatResponseMessage(content=c.text), c.finish_reason
            if (reader := self._reply_reader(req, params, reasoning_reader)) is not None:
                reasoning, content, parts = reader.feed(c.text, finished=True)
                calls = [ToolCall(id=call_id, function=FunctionCall(name=name, arguments=args))
                         for call_id, name, args in merge_calls(parts)]
                message = ChatResponseMessage(
                    content=content or None, tool_calls=calls or None,
                    reasoning_content=reasoning or None)
                finish_reason = reader.finish_reason(finish_reason)
            if req.echoed:
                message.content = req.echoed + (message.content or "")
            choices.append(ChatChoice(index=i, message=message, logprobs=logprobs,
                                      finish_reason=finish_reason, stop_reason=c.stop_reason))
        body = ChatCompletionResponse(
            id=request_id, model=self.served_name(req), choices=choices,
            usage=_usage(len(prompt_ids), outputs, req.n),
            prompt_logprobs=self._prompt_logprobs(outputs[0].prompt_logprobs,
                                                  req.prompt_logprobs))
        return _json(body)

    async def _chat_prompt(self, req: ChatCompletionRequest
                           ) -> tuple[list[int], SamplingParams,
                                      functools.partial[ReasoningReader] | None]:
        """A conversation's prompt ids, sampling parameters (400s for what is refused), and
        what makes the reply's reasoning reader (_reasoning_reader; None: nothing to split)."""
        if req.tool_mode == "auto" and self.tool_call_parser is None:
            # As vLLM: the model's own call format is read only by a parser chosen for it.
            raise APIError(400, 'tool_choice "auto" (the default with tools) needs the server '
                                "started with --enable-auto-tool-choice and --tool-call-parser; "
                                '"required" or a named function work without', param="tool_choice")
        with _refused_as_400():
            prompt_ids = await self._tokenize(lambda tok: _render_chat(tok, req),
                                              _chat_chars(req))
            if (k := self._truncation(req.truncate_prompt_tokens)) is not None:
                prompt_ids = truncate_prompt(prompt_ids, k)
            max_tokens = self._capped(req.output_limit)
            self._check_length(len(prompt_ids), max_tokens)
            params = req.to_sampling_params(max_tokens, req.num_logprobs, self._defaults)
            if req.tool_mode == "auto":
                # A model's call tags may be special tokens (Hermes 2 Pro's are): they must
                # reach the parser, as vLLM's hermes parser keeps them.
                params.skip_special_tokens = False
            reader = self._reasoning_reader(prompt_ids)
            if reader is not None and params.structured_outputs is not None and \
                    reader.func.reasons_first(*reader.args):
                # A reasoning model reasons first, freely; its answer is constrained (vLLM's).
                params.structured_outputs = dataclasses.replace(
                    params.structured_outputs, starts_after=reader.func.END)
        return prompt_ids, params, reader

    def _reasoning_reader(self, prompt_ids: list[int]
                          ) -> functools.partial[ReasoningReader] | None:
        """How the reply's reasoning is read: None without a parser, or after a prompt that
        ends with the end of reasoning (`</think>`, as a template writes it when asked not to
        think: the reply is all answer); else the parser's reader, told whether the prompt
        opened the reasoning (a template that opens `<think>` for the model)."""
        if self.reasoning_parser is None:
            return None
        parser = REASONING_PARSERS[self.reasoning_parser]
        tail = decode(self._tokenizer, prompt_ids[-16:], False).rstrip()
        if tail.endswith(parser.END):
            return None
        return functools.partial(parser, tail.endswith(parser.START))

    async def responses(self, req: ResponsesRequest, raw: Request) -> Response:
        """OpenAI's Responses API, run as the chat request it means (responses.py)."""
        lora = self.check_model(req.model)
        self._check_priority(req.chat.priority)
        chat = req.chat
        prompt_ids, params, reasoning_reader = await self._chat_prompt(chat)
        response_id = new_id("resp")
        stream = await self._submit(response_id, [prompt_ids], params, 1, req.stream,
                                   chat.priority, lora)
        reader = self._reply_reader(chat, params, reasoning_reader)
        events = ResponseEvents(response_id, self.served_name(req), req, self._cache_block)

        async def count(texts: list[str]) -> int:
            # On the worker thread for a long reasoning, as a long prompt is tokenized.
            return await self._tokenize(lambda tok: sum(
                len(encode_prompt(tok, t, False)) for t in texts), sum(map(len, texts)))

        if req.stream:
            return EventStreamResponse(response_events(events, stream, reader, count), stream,
                                       typed=True)
        outputs = await collect_outputs(stream, raw)
        if outputs is None:
            return Response(status_code=_CLIENT_CLOSED)
        return JSONResponse(await whole_response(events, outputs[0], reader, count))

    # ---- vLLM's tokenizer endpoints ------------------------------------------------------------
    async def tokenize(self, req: TokenizeRequest) -> Response:
        """The ids the completion endpoints would give the prompt, or the chat endpoint the
        messages (with the same options). The response is built where the ids are (the worker
        thread for a long input), so that a huge one never stalls the streams."""
        self.check_model(req.model)

        def work(tok) -> str:
            ids = (encode_prompt(tok, req.prompt, req.add_special_tokens is not False)
                   if req.prompt is not None
                   else _render_chat(tok, req, bool(req.add_special_tokens)))
            strs = tok.convert_ids_to_tokens(ids) if req.return_token_strs else None
            return TokenizeResponse(count=len(ids), max_model_len=self.max_model_len,
                                    tokens=ids, token_strs=strs).model_dump_json()

        with _refused_as_400():
            body = await self._tokenize(work, len(req.prompt) if req.prompt is not None
                                        else _chat_chars(req))
        return Response(body, media_type="application/json")

    async def detokenize(self, req: DetokenizeRequest) -> Response:
        self.check_model(req.model)
        # The tokenizer's own ids: a model's vocabulary may be padded past them (their text
        # would read as nothing).
        vocab = len(self._tokenizer)
        if out_of_range := [t for t in req.tokens if t >= vocab]:
            raise APIError(400, f"token id {out_of_range[0]} is out of range: the tokenizer "
                                f"has {vocab} ids", param="tokens")
        body = await self._tokenize(
            lambda tok: DetokenizeResponse(prompt=decode(tok, req.tokens)).model_dump_json(),
            len(req.tokens))
        return Response(body, media_type="application/json")

    # ---- validation and submission ------------------------------------------------------------
    def check_model(self, model: str | None) -> LoRARequest | None:
        """The adapter a request's model names (None: the base model); a 404 for no model."""
        if model in self.loras:
            return self.loras[model]
        if model is not None and model not in self._names:
            raise APIError(404, f"The model `{model}` does not exist.", param="model",
                           code="model_not_found")
        return None

    # ---- vLLM's runtime LoRA endpoints (api_server.lora_router) --------------------------------
    async def load_lora(self, req: LoadLoRAAdapterRequest) -> Response:
        name = req.lora_name
        replaced = self.loras.get(name) if req.load_inplace else None
        if (name in self.loras and replaced is None) or name in self._names \
                or name in self._loading:
            raise APIError(400, f"The lora adapter '{name}' has already been loaded.",
                           param="lora_name")
        if not os.path.exists(os.path.expanduser(req.lora_path)):  # False for any OSError
            raise APIError(404, f"No adapter found at {req.lora_path!r}.", param="lora_path",
                           code="model_not_found")
        # An id taken before the load is awaited: two loads at once get two ids, and a reload
        # a new one, so that requests running with the old weights keep them.
        self._lora_ids += 1
        lora = LoRARequest(name, self._lora_ids, req.lora_path)
        self._loading.add(name)  # a second load of the name meanwhile is refused
        try:
            with _refused_as_400():  # read on a worker thread: the streams go on meanwhile
                await asyncio.to_thread(self.engine.engine.add_lora, lora)
        finally:
            self._loading.discard(name)
        self.loras[name] = lora
        if replaced is not None:
            self._retire_lora(replaced)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora(self, req: UnloadLoRAAdapterRequest) -> Response:
        lora = self.loras.pop(req.lora_name, None)
        if lora is None:
            raise APIError(404, f"The lora adapter '{req.lora_name}' cannot be found.",
                           param="lora_name", code="model_not_found")
        self._retire_lora(lora)
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' removed "
                                 "successfully.")

    def _check_priority(self, priority: int) -> None:
        """Before any work: a priority an fcfs server would silently ignore is a 400."""
        if priority and not self.engine.engine.scheduler.by_priority:
            raise APIError(400, "priority needs a server started with --scheduling-policy "
                                "priority", param="priority")

    def served_name(self, req: Any) -> str:
        """The model a response names: the adapter the request asked for (check_model let
        through no other name; the adapter may be unloaded meanwhile), else the base."""
        return req.model if req.model is not None and req.model not in self._names \
            else self.model_name

    def _check_length(self, num_prompt_tokens: int, max_tokens: int | None) -> None:
        """Refuse up front what cannot fit, rather than silently cutting the output short."""
        if num_prompt_tokens >= self.max_model_len:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} "
                                f"tokens, but the prompt has {num_prompt_tokens} tokens.",
                           param="prompt", code="context_length_exceeded")
        if max_tokens is not None and num_prompt_tokens + max_tokens > self.max_model_len:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} "
                                f"tokens, but {num_prompt_tokens + max_tokens} were requested "
                                f"({num_prompt_tokens} in the prompt, {max_tokens} for the "
                                "completion).", param="max_tokens",
                           code="context_length_exceeded")

    async def _submit(self, request_id: str, prompt_ids: list[list[int]], params: SamplingParams,
                      n: int, stream: bool, priority: int,
                      lora: LoRARequest | None, beam_step: int | None = None) -> OutputStream:
        """One engine request per (prompt, choice), choice index = prompt * n + j. A seeded
        request gives choice j the seed + j, so that the n choices differ but are reproducible.
        beam_step: a beam search's step (_beam_search observes its parameters once); the steps
        after the first continue an admitted request (AsyncEngine.add_requests)."""
        ids, prompts, all_params = [], [], []
        for p, ids_p in enumerate(prompt_ids):
            for j in range(n):
                ids.append(f"{request_id}-{p * n + j}")
                prompts.append(ids_p)
                all_params.append(params.for_choice(j))
        try:
            with _refused_as_400():
                output_stream = await self.engine.add_requests(ids, prompts, all_params,
                                                               stream=stream, priority=priority,
                                                               lora_request=lora,
                                                               continuing=bool(beam_step))
        except QueueFullError as exc:
            raise APIError(429, str(exc), code="queue_full") from exc
        except (EngineClosedError, EngineDeadError) as exc:
            raise APIError(503, str(exc)) from exc
        if self.metrics is not None and beam_step is None:
            self._observe_params(prompt_ids, n, params.max_tokens)
        return output_stream

    def _observe_params(self, prompt_ids: list[list[int]], n: int, max_tokens: int | None) -> None:
        """vLLM's request parameter histograms: n, and the max_tokens in effect (the context's
        room when unset), once per prompt."""
        for ids in prompt_ids:
            self.metrics.observe_params(n, max_tokens or self.max_model_len - len(ids))

    async def _beam_search(self, request_id: str, prompt_ids: list[list[int]],
                           req: CompletionRequest | ChatCompletionRequest,
                           max_tokens: int | None, lora: LoRARequest | None,
                           raw: Request) -> list[RequestOutput] | None:
        """vLLM's use_beam_search (specserve/beam_search.py): every step scores the live beams
        of all prompts as one-token engine requests; each prompt's n beams come back as its n
        choices, best first. None if the client hung up."""
        eos = self.engine.engine.model_config.eos_token_ids
        searches = []
        with _refused_as_400():
            for ids in prompt_ids:
                params = req.beam_search_params(max_tokens or self.max_model_len - len(ids))
                params.validate()
                searches.append(BeamSearch(ids, params, eos))
            # Refused now, not after its first step: from the second on it runs n beams a prompt.
            self.engine.check_admissible(len(prompt_ids) * req.n)
        if self.metrics is not None:
            self._observe_params(prompt_ids, req.n, max_tokens)
        if lora is not None:
            self._searching[lora.lora_int_id] += 1
        try:
            step = 0
            while live := [s for s in searches if not s.done]:
                params = dataclasses.replace(live[0].step_params(), cache_salt=req.cache_salt)
                stream = await self._submit(f"{request_id}-step{step}",
                                            [ids for s in live for ids in s.pending()], params,
                                            1, False, req.priority, lora, beam_step=step)
                outputs = await collect_outputs(stream, raw)
                if outputs is None:
                    return None
                advance_all(live, [out.outputs[0].logprobs[0] for out in outputs])
                step += 1
        finally:
            if lora is not None:
                self._search_ended(lora.lora_int_id)
        return [out for i, s in enumerate(searches)
                for out in s.as_outputs(self._tokenizer, f"{request_id}-{i}")]

    def _retire_lora(self, lora: LoRARequest) -> None:
        """Remove an adapter no name serves any more; running requests keep theirs."""
        if not self._searching[lora.lora_int_id]:  # else the last search with it removes it
            self.engine.engine.remove_lora(lora.lora_int_id)

    def _search_ended(self, lora_int_id: int) -> None:
        """The last search with an adapter unloaded meanwhile (no name serves its id any more:
        ids are never reused) removes it from the engine."""
        self._searching[lora_int_id] -= 1
        if not self._searching[lora_int_id]:
            del self._searching[lora_int_id]
            if all(lora.lora_int_id != lora_int_id for lora in self.loras.values()):
                self.engine.engine.remove_lora(lora_int_id)

    # ---- streaming ----------------------------------------------------------------------------
    def _echo(self, req: CompletionRequest, prompts: list[str | list[int]],
              prompt_ids: list[list[int]]) -> _Echo:
        """Each prompt as echoed: a string as given, token ids decoded. A string's special
        tokens stand in its text, so its offsets count them whatever skip_special_tokens says."""
        return _Echo([p if isinstance(p, str) else decode(self._tokenizer, ids,
                                                           req.skip_special_tokens)
                      for p, ids in zip(prompts, prompt_ids, strict=True)],
                     [req.skip_special_tokens and not isinstance(p, str) for p in prompts])

    async def _completion_events(self, request_id: str, req: CompletionRequest,
                                 stream: OutputStream, prompt_ids: list[list[int]],
                                 echo: _Echo | None) -> AsyncIterator[BaseModel | str]:
        created = int(time.time())
        model = self.served_name(req)
        num_prompt_tokens = sum(len(ids) for ids in prompt_ids)
        deltas = DeltaTracker(len(stream.request_ids), req.stop)
        to_echo = set(range(len(stream.request_ids))) if echo is not None else set()
        scores: dict[int, list | None] = {}  # per prompt, what its choice 0 scored
        final: list[RequestOutput | None] = [None] * len(stream.request_ids)
        text_chunk = TextChunk(lambda i, text: CompletionResponse(
            id=request_id, created=created, model=model,
            choices=[CompletionChoice(index=i, text=text)]))
        continuous_usage, num_tokens = req.continuous_usage, None
        outputs = (stream if echo is None or req.logprobs is None
                   else _choice_zero_first(stream, req.n, scores))
        async for i, out in outputs:
            if req.echo_only:
                out = _without_completion(out)
            c = out.outputs[0]
            if i in to_echo:  # the prompt first, in a chunk of its own (vLLM sends it with
                to_echo.discard(i)  # the first token's text)
                p = i // req.n
                logprobs = None if c.logprobs is None else self._completion_logprobs(
                    out.prompt_token_ids, scores[p], deltas.text_offsets[i],
                    echo.skip_special[p], as_ids=req.return_tokens_as_token_ids)
                usage = _usage_info((num_prompt_tokens, sum(deltas.sent_tokens))
                                    if continuous_usage else None)
                yield CompletionResponse(id=request_id, created=created, model=model,
                                         choices=[CompletionChoice(index=i, text=echo.texts[p],
                                                                   logprobs=logprobs)],
                                         usage=usage)
            text = deltas.text(i, c.text, out.finished)
            token_ids, token_logprobs = deltas.tokens(i, c)
            if continuous_usage:
                num_tokens = (num_prompt_tokens, sum(deltas.sent_tokens))
            logprobs = None
            if token_logprobs is not None:
                logprobs = self._completion_logprobs(token_ids, token_logprobs,
                                                     deltas.text_offsets[i],
                                                     req.skip_special_tokens,
                                                     as_ids=req.return_tokens_as_token_ids)
            if not text and not out.finished and logprobs is None:
                continue
            if out.finished:
                final[i] = out
            elif logprobs is None:  # the chunk of nearly every token: text only
                yield text_chunk.render(i, text, num_tokens)
                continue
            choice = CompletionChoice(index=i, text=text, logprobs=logprobs,
                                      finish_reason=c.finish_reason, stop_reason=c.stop_reason)
            yield CompletionResponse(id=request_id, created=created, model=model,
                                     choices=[choice], usage=_usage_info(num_tokens))
        if req.include_usage:
            yield CompletionResponse(id=request_id, created=created, model=model,
                                     choices=[], usage=_usage(num_prompt_tokens, final, req.n))

    async def _chat_events(self, request_id: str, req: ChatCompletionRequest,
                           params: SamplingParams,
                           reasoning_reader: functools.partial[ReasoningReader] | None,
                           stream: OutputStream, num_prompt_tokens: int
                           ) -> AsyncIterator[BaseModel | str]:
        created, model = int(time.time()), self.served_name(req)

        def chunk(choices: list[ChatStreamChoice], usage: UsageInfo | None = None):
            return ChatCompletionChunk(id=request_id, created=created, model=model,
                                       choices=choices, usage=usage)

        num_choices = len(stream.request_ids)
        continuous_usage = req.continuous_usage
        num_tokens = (num_prompt_tokens, 0) if continuous_usage else None
        # The role comes first, before any token: clients render the turn at once (with what
        # echo repeats, in a chunk of its own as vLLM sends it).
        for i in range(num_choices):
            yield chunk([ChatStreamChoice(index=i, delta=DeltaMessage(role="assistant",
                                                                      content=""))],
                        _usage_info(num_tokens))
            if req.echoed:
                yield chunk([ChatStreamChoice(index=i, delta=DeltaMessage(content=req.echoed))],
                            _usage_info(num_tokens))
        deltas = DeltaTracker(num_choices, req.stop)
        final: list[RequestOutput | None] = [None] * num_choices
        text_chunk = TextChunk(lambda i, text: chunk(
            [ChatStreamChoice(index=i, delta=DeltaMessage(content=text))]))
        reasoning_chunk = TextChunk(lambda i, text: chunk(
            [ChatStreamChoice(index=i, delta=DeltaMessage(reasoning_content=text))]))
        readers = [self._reply_reader(req, params, reasoning_reader)
                   for _ in range(num_choices)]
        async for i, out in stream:
            c = out.outputs[0]
            text = deltas.text(i, c.text, out.finished)
            token_ids, token_logprobs = deltas.tokens(i, c)
            if continuous_usage:
                num_tokens = (num_prompt_tokens, sum(deltas.sent_tokens))
            logprobs = (None if token_logprobs is None else
                        self._chat_logprobs(token_ids, token_logprobs, req.top_logprobs or 0,
                                            req.return_tokens_as_token_ids))
            reasoning, calls, finish_reason = "", [], c.finish_reason
            if (reader := readers[i]) is not None:  # reasoning, text and tool calls
                reasoning, text, calls = reader.feed(text, out.finished)
                if out.finished:
                    finish_reason = reader.finish_reason(finish_reason)
            if not text and not calls and not reasoning and not out.finished and logprobs is None:
                continue
            if out.finished:
                final[i] = out
            elif logprobs is None and not calls and not (text and reasoning):
                # the chunk of nearly every token: text or reasoning only
                yield (reasoning_chunk.render(i, reasoning, num_tokens) if reasoning
                       else text_chunk.render(i, text, num_tokens))
                continue
            delta = DeltaMessage(content=text or None, reasoning_content=reasoning or None,
                                 tool_calls=[
                DeltaToolCall(index=p.index, id=p.id, type="function" if p.id else None,
                              function=DeltaFunctionCall(name=p.name, arguments=p.arguments))
                for p in calls] or None)
            yield chunk([ChatStreamChoice(index=i, delta=delta, logprobs=logprobs,
                                          finish_reason=finish_reason,
                                          stop_reason=c.stop_reason if out.finished else None)],
                        _usage_info(num_tokens))
        if req.include_usage:
            yield chunk([], _usage(num_prompt_tokens, final, req.n))

    def _reply_reader(self, req: ChatCompletionRequest, params: SamplingParams,
                      reasoning_reader: functools.partial[ReasoningReader] | None
                      ) -> ReplyReader | None:
        """reasoning_reader: makes the reply's reasoning reader (_chat_prompt); an answer
        constrained from its start has none."""
        so = params.structured_outputs
        split = reasoning_reader is not None and (so is None or so.starts_after is not None)
        return reply_reader(req, self.tool_call_parser, reasoning_reader if split else None)

    # ---- logprobs -----------------------------------------------------------------------------
    def _decode_token(self, token_id: int) -> str:
        return decode(self._tokenizer, [token_id])

    def _completion_logprobs(self, token_ids: Sequence[int],
                             logprobs: Sequence[dict[int, float] | None], offsets: TextOffsets,
                             skip_special: bool, result: CompletionLogprobs | None = None,
                             as_ids: bool = False) -> CompletionLogprobs:
        """OpenAI's legacy logprobs of token_ids, appended to result (a new one if None). An
        entry is None for a prompt's first token, which nothing precedes (echo). as_ids:
        tokens named "token_id:N" (vLLM's return_tokens_as_token_ids)."""
        result = CompletionLogprobs() if result is None else result
        name = _token_id_name if as_ids else self._token_text
        for token, entry in zip(token_ids, logprobs, strict=True):
            result.tokens.append(name(token))
            result.token_logprobs.append(None if entry is None else entry[token])
            # The sampled token is always included, so there may be logprobs + 1 entries.
            result.top_logprobs.append(None if entry is None else
                                       {name(t): lp for t, lp in entry.items()})
            skipped = skip_special and token in self._special_ids  # not in the text
            result.text_offset.append(offsets.add(b"" if skipped else self._token_bytes(token)))
        return result

    @staticmethod
    def _prompt_logprobs(scores: list | None, asked: int | None) -> PromptLogprobs | None:
        """vLLM's prompt_logprobs of a response, when the request asked for them (keyed by token
        id, so return_tokens_as_token_ids leaves their text alone, as in vLLM)."""
        if asked is None or scores is None:
            return None
        return [None if entry is None else
                {t: PromptLogprob(logprob=lp, rank=lp.rank, decoded_token=lp.decoded_token)
                 for t, lp in entry.items()}
                for entry in scores]

    def _chat_logprobs(self, token_ids: Sequence[int], logprobs: Sequence[dict[int, float]],
                       num_top: int, as_ids: bool = False) -> ChatChoiceLogprobs:
        name = _token_id_name if as_ids else self._token_text
        content = []
        for token, entry in zip(token_ids, logprobs, strict=True):
            top = sorted(entry.items(), key=lambda kv: kv[1], reverse=True)[:num_top]
            content.append(TokenLogprob(token=name(token), logprob=entry[token],
                                        bytes=list(self._token_bytes(token)),
                                        top_logprobs=[TopLogprob(
                                            token=name(t), logprob=lp,
                                            bytes=list(self._token_bytes(t))) for t, lp in top]))
        return ChatChoiceLogprobs(content=content)


def _token_id_name(token: int) -> str:
    return f"token_id:{token}"


@contextlib.contextmanager
def _refused_as_400() -> Iterator[None]:
    """A ValueError from reading the request (SamplingParams, the chat template, the engine's
    admission checks) is the client's mistake: a 400. Anywhere else it is our bug, a 500 like
    any other (it once sent a 400 for logprobs cut short by a stop inside accepted drafts)."""
    try:
        yield
    except ValueError as exc:
        raise APIError(400, str(exc)) from exc


def _chat_chars(req: ChatCompletionRequest | TokenizeRequest) -> int:
    """About the characters a conversation's rendering tokenizes (its documents, tools and
    earlier calls included)."""
    return (sum(len(str(m.content)) + len(str(m.tool_calls or "")) for m in req.messages)
            + sum(len(v) for d in req.documents or () for v in d.values())
            + sum(len(str(t)) for t in req.tools or ()))


def _render_chat(tokenizer, req: ChatCompletionRequest | TokenizeRequest,
                 add_special_tokens: bool = False) -> list[int]:
    return encode_chat(tokenizer, [m.to_template_dict() for m in req.messages],
                       add_special_tokens=add_special_tokens,
                       add_generation_prompt=req.add_generation_prompt,
                       continue_final_message=req.continue_final_message,
                       documents=req.documents, tools=req.template_tools(),
                       template_kwargs=req.chat_template_kwargs)


@dataclasses.dataclass(slots=True)
class _Echo:
    texts: list[str]  # per prompt, the text echoed
    skip_special: list[bool]  # per prompt, whether its special tokens are left out of the text


async def _choice_zero_first(stream: OutputStream, n: int, scores: dict[int, list | None]
                             ) -> AsyncIterator[tuple[int, RequestOutput]]:
    """The stream's outputs, each prompt's other choices held back until its choice 0 (which
    alone scores the prompt) has delivered, so that every echo can carry the scores; each
    prompt's scores are recorded in `scores`."""
    held: dict[int, list[tuple[int, RequestOutput]]] = {}
    async for i, out in stream:
        p = i // n
        if i % n == 0:
            scores[p] = out.prompt_logprobs
            yield i, out
            for item in held.pop(p, ()):
                yield item
        elif p in scores:
            yield i, out
        else:
            held.setdefault(p, []).append((i, out))


def _without_completion(out: RequestOutput) -> RequestOutput:
    """out as if it had generated nothing (echo with max_tokens 0), finished for length."""
    c = out.outputs[0]
    empty = dataclasses.replace(c, text="", token_ids=[],
                                logprobs=None if c.logprobs is None else [],
                                cumulative_logprob=None if c.logprobs is None else 0.0,
                                finish_reason="length" if c.finish_reason else None,
                                stop_reason=None)
    return dataclasses.replace(out, outputs=[empty], delta_text="", delta_token_ids=[])


def _usage_info(num_tokens: tuple[int, int] | None) -> UsageInfo | None:
    """(prompt, completion) tokens as usage; None stays None (no usage in this chunk)."""
    if num_tokens is None:
        return None
    prompt, completion = num_tokens
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion,
                     total_tokens=prompt + completion)


def _usage(num_prompt_tokens: int, outputs: Sequence[RequestOutput | None],
           n: int) -> UsageInfo:
    """A response's final usage. Its prompts are counted once each, as are the tokens their
    first choices read from the prefix cache (the other choices share that prefill)."""
    completion = sum(len(o.outputs[0].token_ids) for o in outputs if o is not None)
    cached = sum(o.metrics.num_cached_tokens for o in outputs[::n]
                 if o is not None and o.metrics is not None)
    return UsageInfo(prompt_tokens=num_prompt_tokens, completion_tokens=completion,
                     total_tokens=num_prompt_tokens + completion,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


def _json(body: BaseModel) -> Response:
    return Response(body.model_dump_json(), media_type="application/json")
