"""OpenAI API request and response models (completions, chat completions, models).

Scalars are strict: `"max_tokens": "5"` or `"stream": 1` is a 400, not silently coerced. Unknown
fields are ignored, as OpenAI's API and vLLM do, but known features we do not implement (suffix,
beam search, ...) are refused rather than silently ignored, and so is an unknown key in
our own objects (`speculation`, `structured_outputs`). Structured outputs come as OpenAI's
`response_format` or vLLM's `structured_outputs` body field.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from specserve.beam_search import MAX_BEAM_WIDTH, BeamSearchParams
from specserve.sampling_params import SamplingParams, StructuredOutputsParams
from specserve.server.tool_calls import arguments_schema, calls_schema, strict_loads

MAX_N = 128  # OpenAI's limit on choices per request
MAX_LOGPROBS = 20
# Bounds on what one request may list, so that no request can make every step slow for all
# (each stop string is searched after every token of every choice, the bias applied at every
# step) or the server copy a huge list per choice. vLLM sets none; OpenAI allows 4 stops.
MAX_STOP_STRINGS, MAX_STOP_CHARS = 64, 1024
MAX_LISTED_TOKENS = 4096  # stop_token_ids, logit_bias entries
_INT32_MAX = 2**31 - 1
_FLOAT32_MAX = 3.4028234663852886e38  # a larger repetition_penalty makes a 0 logit NaN


def one_of(description: str) -> WrapValidator:
    """For a union field: one clear sentence instead of pydantic's error per union member, naming
    the key when an object member refused an unknown one."""
    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            unknown = [e["loc"][-1] for e in exc.errors() if e["type"] == "extra_forbidden"]
            if unknown:
                raise PydanticCustomError(
                    "extra_forbidden", f"unknown key {unknown[0]!r}: should be {description}",
                ) from None
            raise PydanticCustomError("invalid_value", f"should be {description}") from None
    return WrapValidator(validate)


def refuse_unsupported(data: Any, unsupported: dict[str, tuple]) -> Any:
    """For a before-validator: a known field we do not implement, set to anything but the values
    that mean "not used", is a 400 rather than silently ignored."""
    if isinstance(data, dict):
        for name, unused in unsupported.items():
            if data.get(name) not in unused:  # an absent field reads as None
                raise ValueError(f"{name} is not supported")
    return data


PositiveInt = Annotated[StrictInt, Field(ge=1)]
TokenId = Annotated[StrictInt, Field(ge=0, le=_INT32_MAX)]
SpecTokens = Annotated[StrictInt, Field(ge=0, le=16)]


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="ignore")
    # Fields where null means something of its own rather than "the default".
    _null_is_none: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data: Any) -> Any:
        """OpenAI's fields are nullable, and clients send null for "not set" (`"n": null`,
        `"stream": null`): such a field takes its default, as in OpenAI's API and vLLM's."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items()
                if v is not None or k not in fields or fields[k].default is None
                or k in cls._null_is_none}


# ---- requests -------------------------------------------------------------------------------
class StreamOptions(OpenAIModel):
    include_usage: StrictBool = False
    # vLLM's: with include_usage, every chunk also carries the usage so far.
    continuous_usage_stats: StrictBool = False


class SpeculationOptions(OpenAIModel):
    model_config = ConfigDict(extra="forbid")  # ours: a misspelt key is a mistake, not a feature
    num_speculative_tokens: SpecTokens | None = None
    policy: Literal["off", "static", "adaptive"] | None = None


class JsonSchemaFormat(OpenAIModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: StrictStr | None = None
    description: StrictStr | None = None
    json_schema: dict | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsOptions(OpenAIModel):
    """vLLM's `structured_outputs` extra body field: exactly one constraint."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    json_schema: dict | StrictStr | None = Field(default=None, alias="json")
    json_object: StrictBool | None = None
    regex: StrictStr | None = None
    choice: list[StrictStr] | None = None
    grammar: StrictStr | None = None
    disable_any_whitespace: StrictBool = False


# vLLM's sampling extras that change the output and that we do not implement, with the values
# that leave them off.
_UNSUPPORTED_SAMPLING = {
    "logits_processors": (None, []),
    "guided_whitespace_pattern": (None,),
}


# What a beam search request may set (the rest of a request's fields sample, constrain, stop on
# text or stream: refused with use_beam_search); the chat template's options are the chat
# request's own.
_BEAM_SEARCH_FIELDS = frozenset({
    "model", "n", "temperature", "user", "ignore_eos", "cache_salt", "priority",
    "skip_special_tokens", "include_stop_str_in_output", "truncate_prompt_tokens",
    "use_beam_search", "length_penalty", "prompt", "max_tokens", "add_special_tokens",
    "messages", "max_completion_tokens", "chat_template", "chat_template_kwargs",
    "best_of",  # completions: only equal to n (older vLLM clients send the beam width twice)
    "add_generation_prompt", "continue_final_message", "documents", "include_reasoning",
    "stream_options", "return_tokens_as_token_ids", "seed"})
# Values given explicitly that leave a sampling field off (allowed beside use_beam_search).
_NEUTRAL: dict[str, tuple] = {
    "top_p": (1,), "top_k": (0, -1), "min_p": (0,), "presence_penalty": (0,),
    "frequency_penalty": (0,), "repetition_penalty": (1,), "stop": ([],), "stop_token_ids": ([],),
    "bad_words": ([],), "logit_bias": ({},), "min_tokens": (0,), "tool_choice": ("none",),
    "tools": ([],)}


class SamplingRequest(OpenAIModel):
    """Fields shared by completions and chat completions."""

    model: StrictStr | None = None
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] = 1
    temperature: Annotated[StrictFloat, Field(ge=0, le=2)] | None = None
    top_p: Annotated[StrictFloat, Field(gt=0, le=1)] | None = None
    seed: Annotated[StrictInt, Field(ge=-(2**63), le=2**64 - 1)] | None = None
    stop: Annotated[
        Annotated[StrictStr, Field(max_length=MAX_STOP_CHARS)]
        | Annotated[list[Annotated[StrictStr, Field(max_length=MAX_STOP_CHARS)]],
                    Field(max_length=MAX_STOP_STRINGS)] | None,
        one_of(f"a string or a list of at most {MAX_STOP_STRINGS} strings, each at most "
               f"{MAX_STOP_CHARS} characters")] = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None
    presence_penalty: Annotated[StrictFloat, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[StrictFloat, Field(ge=-2, le=2)] | None = None
    # OpenAI's keys are token ids as strings.
    logit_bias: Annotated[dict[str, Annotated[StrictFloat, Field(ge=-100, le=100)]],
                          Field(max_length=MAX_LISTED_TOKENS)] | None = None
    # Extensions (vLLM's names where vLLM has them).
    top_k: Annotated[StrictInt, Field(ge=-1, le=_INT32_MAX)] | None = None
    min_p: Annotated[StrictFloat, Field(ge=0, le=1)] | None = None
    min_tokens: Annotated[StrictInt, Field(ge=0)] = 0
    ignore_eos: StrictBool = False
    repetition_penalty: Annotated[StrictFloat, Field(gt=0, le=_FLOAT32_MAX)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_LISTED_TOKENS)] | None = None
    # The only tokens that may be emitted; words that may not (both vLLM's).
    allowed_token_ids: Annotated[list[TokenId], Field(min_length=1,
                                                      max_length=MAX_LISTED_TOKENS)] | None = None
    bad_words: Annotated[list[Annotated[StrictStr, Field(max_length=MAX_STOP_CHARS)]],
                         Field(max_length=MAX_STOP_STRINGS)] | None = None
    # vLLM's: prefix-cache hits only among requests with the same salt (per tenant).
    cache_salt: Annotated[StrictStr, Field(min_length=1, max_length=1024)] | None = None
    # vLLM's: lower is served first (and preempted last) by a server started with
    # --scheduling-policy priority; anything but 0 is refused by one that is not.
    priority: Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)] = 0
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    # vLLM's: each prompt token's logprob (and this many top ones), in the response's
    # prompt_logprobs (not with stream, as vLLM; a completion's echo streams them instead).
    prompt_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    # vLLM's: logprob tokens as "token_id:N" (a token holding part of a UTF-8 character has
    # no text of its own; RL trainers read the ids back).
    return_tokens_as_token_ids: StrictBool = False
    # vLLM's: keep only the prompt's last k tokens (-1: the model's context); the endpoints cut
    # before checking lengths.
    truncate_prompt_tokens: Annotated[StrictInt, Field(ge=-1)] | None = None
    # Speculative decoding for this request: K (0 = off), or
    # {"num_speculative_tokens": K, "policy": "off" | "static" | "adaptive"}.
    speculation: Annotated[SpecTokens | SpeculationOptions | None,
                           one_of("an integer 0..16 or an object with num_speculative_tokens "
                                  "0..16 and/or policy off|static|adaptive")] = None
    # vLLM's: beam search with n beams, ranked by cum_logprob / length ** length_penalty
    # (specserve/beam_search.py); only the fields in _BEAM_SEARCH_FIELDS apply to it.
    use_beam_search: StrictBool = False
    length_penalty: Annotated[StrictFloat, Field(allow_inf_nan=False)] = 1.0
    # Structured outputs: OpenAI's response_format, or vLLM's structured_outputs.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsOptions | None = None
    _structured: StructuredOutputsParams | None = PrivateAttr(default=None)
    _bias_by_id: dict[int, float] | None = PrivateAttr(default=None)
    # vLLM's older names for the same constraints, still sent by code written for it.
    guided_json: dict | StrictStr | None = None
    guided_regex: StrictStr | None = None
    guided_choice: list[StrictStr] | None = None
    guided_grammar: StrictStr | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported_sampling(cls, data: Any) -> Any:
        return refuse_unsupported(data, _UNSUPPORTED_SAMPLING)

    @model_validator(mode="after")
    def _check_common(self) -> SamplingRequest:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs is not available when stream is true")
        if self.truncate_prompt_tokens == 0:
            raise ValueError("truncate_prompt_tokens must be >= 1, or -1 for the model's context")
        if self.use_beam_search:
            self._check_beam_search()
        elif self.length_penalty != 1.0:
            raise ValueError("length_penalty applies only with use_beam_search")
        # Parsed once here (they raise for bad input), read by to_sampling_params.
        self._bias_by_id = self._parse_logit_bias()
        self._structured = self._parse_structured_outputs()
        return self

    def _check_beam_search(self) -> None:
        """Beam search ranks the model's own log-probabilities: what samples, constrains, stops
        on text or streams does not apply, and is refused rather than ignored."""
        if self.n > MAX_BEAM_WIDTH:
            raise ValueError(f"use_beam_search takes n (the beam width) up to {MAX_BEAM_WIDTH}")
        if self.temperature not in (None, 0):
            raise ValueError("use_beam_search ranks the model's own log-probabilities: "
                             "temperature must be 0 or unset")
        given = [name for name, f in type(self).model_fields.items()
                 if name not in _BEAM_SEARCH_FIELDS and getattr(self, name) != f.default
                 and getattr(self, name) not in _NEUTRAL.get(name, ())]
        if given:
            raise ValueError(f"{', '.join(given)} cannot be used with use_beam_search (it "
                             f"takes {', '.join(sorted(_BEAM_SEARCH_FIELDS))})")

    def beam_search_params(self, max_tokens: int) -> BeamSearchParams:
        return BeamSearchParams(beam_width=self.n, max_tokens=max_tokens,
                                ignore_eos=self.ignore_eos, length_penalty=self.length_penalty,
                                include_stop_str_in_output=self.include_stop_str_in_output,
                                skip_special_tokens=self.skip_special_tokens)

    def _parse_structured_outputs(self) -> StructuredOutputsParams | None:
        fmt, so = self.response_format, self.structured_outputs
        guided = {name: getattr(self, f"guided_{name}")
                  for name in ("json", "regex", "choice", "grammar")
                  if getattr(self, f"guided_{name}") is not None}
        given = [name for name, on in (("response_format", fmt is not None and fmt.type != "text"),
                                       ("structured_outputs", so is not None),
                                       ("guided_*", bool(guided))) if on]
        if len(given) > 1:
            raise ValueError(f"give one of {' and '.join(given)}, not both")
        if guided:
            return StructuredOutputsParams(**guided)
        if fmt is not None and fmt.type != "text":
            if fmt.type == "json_object":
                return StructuredOutputsParams(json_object=True)
            if fmt.json_schema is None or fmt.json_schema.json_schema is None:
                raise ValueError("response_format json_schema needs json_schema.schema")
            return StructuredOutputsParams(json=fmt.json_schema.json_schema)
        if so is None:
            return None
        return StructuredOutputsParams(json=so.json_schema, json_object=so.json_object,
                                       regex=so.regex, choice=so.choice, grammar=so.grammar,
                                       disable_any_whitespace=so.disable_any_whitespace)

    def _parse_logit_bias(self) -> dict[int, float] | None:
        if not self.logit_bias:
            return None
        bias = {}
        for token, value in self.logit_bias.items():
            if not (token.isascii() and token.isdigit()):
                raise ValueError(f"logit_bias keys must be token ids (non-negative integers as "
                                 f"strings), got {token!r}")
            if int(token) in bias:
                raise ValueError(f"logit_bias names token {int(token)} twice")
            bias[int(token)] = value
        return bias

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        # vLLM's rule: only together with include_usage.
        return self.include_usage and self.stream_options.continuous_usage_stats

    @property
    def num_prompt_logprobs(self) -> int | None:
        return self.prompt_logprobs

    def to_sampling_params(self, max_tokens: int | None, logprobs: int | None,
                           defaults: SamplingParams) -> SamplingParams:
        """defaults: what the engine samples with where the request is silent (the model's
        generation_config.json applied, LLMEngine.default_sampling_params)."""
        spec, policy = self.speculation, None
        if isinstance(spec, SpeculationOptions):
            spec, policy = spec.num_speculative_tokens, spec.policy

        def given(value, default):
            return default if value is None else value

        return SamplingParams(
            n=1,  # the server fans out n engine requests
            temperature=given(self.temperature, defaults.temperature),
            top_p=given(self.top_p, defaults.top_p),
            top_k=given(self.top_k, defaults.top_k), min_p=given(self.min_p, defaults.min_p),
            seed=self.seed, max_tokens=max_tokens,
            min_tokens=self.min_tokens, stop=self.stop, stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos, logprobs=logprobs,
            prompt_logprobs=self.num_prompt_logprobs,
            truncate_prompt_tokens=self.truncate_prompt_tokens,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            num_speculative_tokens=spec, speculation_policy=policy,
            structured_outputs=self._structured,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=given(self.repetition_penalty, defaults.repetition_penalty),
            logit_bias=self._bias_by_id, allowed_token_ids=self.allowed_token_ids,
            bad_words=self.bad_words or None, cache_salt=self.cache_salt)


class CompletionRequest(SamplingRequest):
    prompt: Annotated[StrictStr | list[StrictStr] | list[TokenId] | list[list[TokenId]],
                      one_of("a string, a list of strings, a list of token ids or a list of "
                             "lists of token ids")]
    # Absent: OpenAI's 16; null: the rest of the context (vLLM's reading).
    _null_is_none = frozenset({"max_tokens"})
    # 0 only with echo: the prompt scored, nothing generated (OpenAI's legacy scoring request).
    max_tokens: Annotated[StrictInt, Field(ge=0)] | None = 16
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    # vLLM's: a completion's prompt gets the tokenizer's special tokens (a BOS) unless false.
    add_special_tokens: StrictBool = True
    echo: StrictBool = False
    suffix: StrictStr | None = None
    best_of: StrictInt | None = None

    @model_validator(mode="after")
    def _check_completion(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens must be at least 1 (0 only with echo: the prompt "
                             "scored, nothing generated)")
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of is not supported (it may only equal n)")
        return self

    @property
    def echo_only(self) -> bool:
        """echo with max_tokens 0: the engine generates one token, which is left out."""
        return self.echo and self.max_tokens == 0

    @property
    def num_prompt_logprobs(self) -> int | None:
        """Echoed with logprobs, the prompt's tokens get them too (as OpenAI's legacy API and
        vLLM do: lm-eval scores a text this way); the prompt_logprobs field wins, as in vLLM."""
        if self.prompt_logprobs is None and self.echo:
            return self.logprobs
        return self.prompt_logprobs

    def prompts(self) -> list[str | list[int]]:
        """The batch of prompts: one string, a list of strings, token ids, or lists of them."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        if not p:
            raise ValueError("prompt must not be empty")
        return list(p)


# ---- tool calling (OpenAI's function tools; the logic is in tool_calls.py) -------------------
class FunctionDefinition(OpenAIModel):
    name: Annotated[StrictStr, Field(min_length=1, max_length=256)]
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema
    strict: StrictBool | None = None  # whatever it says, required and named calls are forced


class ChatTool(OpenAIModel):
    type: Literal["function"]
    function: FunctionDefinition


class _FunctionName(OpenAIModel):
    name: StrictStr


class NamedToolChoice(OpenAIModel):
    type: Literal["function"]
    function: _FunctionName


class FunctionCall(OpenAIModel):
    name: StrictStr
    arguments: StrictStr  # JSON text, as OpenAI sends it


class ToolCall(OpenAIModel):
    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCall


class TextPart(OpenAIModel):
    type: Literal["text"]
    text: StrictStr


def joined_text(content: str | list) -> str:
    """A message's content as one text: its text parts joined by newlines, as
    engine/prompts.py joins them for the template."""
    return content if isinstance(content, str) else "\n".join(p.text for p in content)


class ChatMessage(OpenAIModel):
    # developer: OpenAI's successor of system (engine/prompts.py renders it as system for
    # templates that predate it).
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[StrictStr | list[TextPart] | None,
                       one_of("a string or a list of parts of type text")] = None
    name: StrictStr | None = None
    tool_call_id: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls

    @model_validator(mode="after")
    def _check_content(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"a {self.role} message cannot have tool_calls")
        return self

    def to_template_dict(self) -> dict:
        """The message as engine/prompts.py renders it (which joins text parts). Earlier tool
        calls carry their arguments as an object, as transformers' chat templates read them
        (vLLM converts them too)."""
        content = self.content or ""
        if not isinstance(content, str):
            content = [part.model_dump() for part in content]
        message = {"role": self.role, "content": content}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": call.id, "type": call.type,
                 "function": {"name": call.function.name,
                              "arguments": _arguments_object(call.function.arguments)}}
                for call in self.tool_calls]
        return message


def _arguments_object(arguments: str) -> dict:
    """OpenAI's arguments: the JSON text of an object (a template may iterate over it)."""
    try:
        value = strict_loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"a tool call's arguments must be the JSON text of an object, got "
                         f"{arguments[:80]!r}")
    return value


# Chat fields of OpenAI's and vLLM's that change the output and that we do not implement, with
# the values that leave them off. A per-request chat_template is refused as vLLM refuses it by
# default (it is arbitrary code for the template engine).
_UNSUPPORTED_CHAT = {
    "functions": (None, []), "function_call": (None, "none", "auto"), "audio": (None,),
    "modalities": (None, ["text"]), "web_search_options": (None,),
    "chat_template": (None,), "add_special_tokens": (None, False),
}


class ChatTemplateOptions(OpenAIModel):
    """How messages are rendered with the chat template (vLLM's fields): close the conversation
    with the assistant's header (the default), or leave the final message open for the model to
    continue (a prefill), or neither; the template's own variables; documents for templates
    that take them (RAG). The chat endpoint and /tokenize render alike."""

    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, StrictStr]] | None = None
    tools: list[ChatTool] | None = None  # given to the template (one without tools ignores them)

    def template_tools(self) -> list[dict] | None:
        """The tools as the template sees them: OpenAI's fields in OpenAI's order, unset ones
        left out (as vLLM gives them)."""
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None


class ChatCompletionRequest(SamplingRequest, ChatTemplateOptions):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: PositiveInt | None = None  # deprecated by OpenAI for max_completion_tokens
    max_completion_tokens: PositiveInt | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    # None with tools: "auto", as in OpenAI's API.
    tool_choice: Annotated[Literal["none", "auto", "required"] | NamedToolChoice | None,
                           one_of('"none", "auto", "required" or {"type": "function", '
                                  '"function": {"name": ...}}')] = None
    parallel_tool_calls: StrictBool = True
    # vLLM's: with --reasoning-parser, false leaves the reasoning out of the response.
    include_reasoning: StrictBool = True
    # vLLM's: the reply's content starts with the last message's, when that has the reply's
    # role (the message continue_final_message continues).
    echo: StrictBool = False

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported_chat(cls, data: Any) -> Any:
        return refuse_unsupported(data, _UNSUPPORTED_CHAT)

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        names = [t.function.name for t in self.tools or ()]
        if len(set(names)) != len(names):
            raise ValueError("tools must have distinct function names")
        if self.tool_choice not in (None, "none", "auto") and not self.tools:
            raise ValueError("tool_choice needs tools")
        mode = self.tool_mode
        if mode in ("named", "required"):  # the reply is constrained to calls
            if self._structured is not None:
                raise ValueError(f"tool_choice {mode} sets the reply's format: give it or a "
                                 "structured output, not both")
            if mode == "named":
                name = self.tool_choice.function.name
                if name not in names:
                    raise ValueError(f"tool_choice names the function {name!r}, which is not "
                                     "among the tools")
                schema = arguments_schema(self.tools[names.index(name)].function.parameters)
            else:
                schema = calls_schema([(t.function.name, t.function.parameters)
                                       for t in self.tools], self.parallel_tool_calls)
            self._structured = StructuredOutputsParams(json=schema)
        return self

    @property
    def tool_mode(self) -> str | None:
        """How the reply is read: None (text), "auto", "required" or "named"."""
        if not self.tools or self.tool_choice == "none":
            return None
        if isinstance(self.tool_choice, NamedToolChoice):
            return "named"
        return self.tool_choice or "auto"

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def echoed(self) -> str:
        """What echo puts before each reply's content ("" without echo): the last message's, if
        it has the reply's role (vLLM's rule: the assistant's, or any without a generation
        prompt, when the reply continues the last message)."""
        last = self.messages[-1]
        role = "assistant" if self.add_generation_prompt else last.role
        if not self.echo or last.role != role or last.content is None:
            return ""
        return joined_text(last.content)

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


# ---- responses --------------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int  # read from the prefix cache


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # OpenAI's (vLLM's with --enable-prompt-tokens-details): in a response's final usage.
    prompt_tokens_details: PromptTokensDetails | None = None

    @model_serializer(mode="wrap")
    def _omit_unset_details(self, handler) -> dict:
        out = handler(self)
        if out.get("prompt_tokens_details") is None:
            out.pop("prompt_tokens_details", None)
        return out


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's serialised Logprob, the values of a prompt_logprobs entry (keyed by token id)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[int, PromptLogprob] | None]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None

    @model_serializer(mode="wrap")
    def _omit_absent_prompt_logprobs(self, handler) -> dict:
        # Only a response that asked for them carries the key (a streamed chunk never does).
        data = handler(self)
        if data.get("prompt_logprobs", 0) is None:
            del data["prompt_logprobs"]
        return data


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None  # with --reasoning-parser


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A streamed tool call: the first delta of call `index` has its id, type and name, later
    ones only more of its arguments (fields left out, not null, as OpenAI streams them)."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall

    @model_serializer
    def _omit_unset(self) -> dict:
        out: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            out["id"], out["type"] = self.id, self.type
        out["function"] = {k: v for k, v in (("name", self.function.name),
                                             ("arguments", self.function.arguments))
                           if v is not None}
        return out


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = None  # vLLM's, with the request's prompt_logprobs


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    @model_serializer
    def _omit_unset(self) -> dict:
        # OpenAI sends {"role": ...} once, then {"content": ...}, then {}: absent, not null.
        out: dict[str, Any] = {k: v for k, v in (("role", self.role), ("content", self.content),
                                                 ("reasoning_content", self.reasoning_content))
                               if v is not None}
        if self.tool_calls:
            out["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        return out


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # vLLM's: the stop string or token that ended it


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "specserve"
    root: str | None = None  # a LoRA adapter's directory (vLLM's)
    parent: str | None = None  # a LoRA adapter's base model (vLLM's)
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ---- vLLM's /tokenize and /detokenize -----------------------------------------------------------
class TokenizeRequest(ChatTemplateOptions):
    """A prompt, or chat messages rendered with the model's chat template, as the endpoints
    would tokenize them (vLLM's two request shapes in one: exactly one of prompt, messages)."""

    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    # None: a prompt gets the tokenizer's special tokens, rendered chat none (its template
    # writes its own), as the completion endpoints encode them.
    add_special_tokens: StrictBool | None = None
    return_token_strs: StrictBool = False

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported_chat(cls, data: Any) -> Any:
        # What the chat endpoint refuses would be counted wrongly here.
        return refuse_unsupported(data, {"chat_template": (None,)})

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class LoadLoRAAdapterRequest(OpenAIModel):
    """vLLM's runtime adapter loading (--allow-runtime-lora-updating)."""

    lora_name: Annotated[StrictStr, Field(min_length=1)]
    lora_path: Annotated[StrictStr, Field(min_length=1)]
    # vLLM's: reload a loaded name from its (new) path; requests already running keep the old
    # weights.
    load_inplace: StrictBool = False


class UnloadLoRAAdapterRequest(OpenAIModel):
    lora_name: Annotated[StrictStr, Field(min_length=1)]
    lora_int_id: StrictInt | None = None  # vLLM's; the name decides


class DetokenizeRequest(OpenAIModel):
    model: StrictStr | None = None
    tokens: Annotated[list[TokenId], Field(max_length=1 << 20)]


class DetokenizeResponse(BaseModel):
    prompt: str
