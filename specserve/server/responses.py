"""OpenAI's Responses API (`POST /v1/responses`), as vLLM serves it, over the chat endpoint's
machinery: a request is read into the chat request it means (input items as messages,
`instructions` as a system message, function tools, `text.format` as a structured output) and
runs as one; its reply comes back as output items (reasoning, a message, function calls),
whole or as the API's typed stream events (response_events.py).

Stateless: nothing is stored, so `previous_response_id` and `background` are refused; a client
sends the whole conversation as `input` (the function calls and their outputs included), as
with `store: false`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from specserve.server.protocol import (
    ChatCompletionRequest,
    FunctionDefinition,
    JsonSchemaFormat,
    OpenAIModel,
    PositiveInt,
    SpecTokens,
    SpeculationOptions,
    joined_text,
    one_of,
    refuse_unsupported,
)


# ---- the request -------------------------------------------------------------------------------
class ContentPart(OpenAIModel):
    type: Literal["input_text", "output_text", "text"]
    text: StrictStr


class MessageItem(OpenAIModel):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Annotated[StrictStr | list[ContentPart],
                       one_of("a string or a list of input_text parts")]


class FunctionCallItem(OpenAIModel):
    """A call the model made earlier, sent back with the conversation."""

    type: Literal["function_call"]
    call_id: StrictStr
    name: StrictStr
    arguments: StrictStr
    id: StrictStr | None = None


class FunctionCallOutputItem(OpenAIModel):
    type: Literal["function_call_output"]
    call_id: StrictStr
    output: Annotated[StrictStr | list[ContentPart],
                      one_of("a string or a list of text parts")]


class ReasoningItem(OpenAIModel):
    """Earlier reasoning, sent back: not rendered (chat templates drop it too)."""

    type: Literal["reasoning"]


InputItem = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem,
                      one_of("a message, function_call, function_call_output or reasoning "
                             "item")]


class FunctionTool(FunctionDefinition):
    """The Responses API's function tool: the chat tool's function, flattened."""

    type: Literal["function"]


class NamedFunction(OpenAIModel):
    type: Literal["function"]
    name: StrictStr


class TextFormat(JsonSchemaFormat):
    """The chat endpoint's json_schema format, flattened, with its type."""

    type: Literal["text", "json_object", "json_schema"]

    @model_validator(mode="after")
    def _schema_given(self) -> TextFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("a json_schema format needs a schema")
        return self


class TextConfig(OpenAIModel):
    format: TextFormat | None = None


# Known fields that would change the result and that are not implemented (the first three
# need stored state).
_UNSUPPORTED = {"previous_response_id": (None,), "conversation": (None,),
                "background": (None, False), "prompt": (None,), "top_logprobs": (None, 0),
                "truncation": (None, "disabled"), "max_tool_calls": (None,)}


# The chat request's fields as this API names them (in its validation errors).
_FIELD_NAMES = {"messages": "input", "max_completion_tokens": "max_output_tokens",
                "response_format": "text.format"}


class ResponsesRequest(OpenAIModel):
    model: StrictStr | None = None
    input: Annotated[StrictStr | Annotated[list[InputItem], Field(min_length=1)],
                     one_of("a string or a non-empty list of input items")]
    instructions: StrictStr | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Annotated[StrictFloat, Field(ge=0, le=2)] | None = None
    top_p: Annotated[StrictFloat, Field(gt=0, le=1)] | None = None
    stream: StrictBool = False
    tools: list[FunctionTool] | None = None
    tool_choice: Annotated[Literal["none", "auto", "required"] | NamedFunction | None,
                           one_of('"none", "auto", "required" or {"type": "function", '
                                  '"name": ...}')] = None
    parallel_tool_calls: StrictBool = True
    text: TextConfig | None = None
    metadata: dict[str, StrictStr] | None = None
    user: StrictStr | None = None
    # Accepted, with nothing to do: a stateless server stores nothing and has no reasoning
    # effort to set or encrypted reasoning to include (message.output_text.logprobs is
    # refused).
    store: StrictBool | None = None
    reasoning: dict[str, Any] | None = None
    include: list[StrictStr] | None = None
    # Extensions, as on the chat endpoint.
    seed: StrictInt | None = None
    top_k: StrictInt | None = None
    min_p: StrictFloat | None = None
    repetition_penalty: StrictFloat | None = None
    speculation: SpecTokens | SpeculationOptions | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    cache_salt: StrictStr | None = None
    priority: StrictInt | None = None
    _chat: ChatCompletionRequest = PrivateAttr()

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("include"), list) and \
                "message.output_text.logprobs" in data["include"]:
            raise ValueError("include message.output_text.logprobs is not supported")
        return refuse_unsupported(data, _UNSUPPORTED)

    @model_validator(mode="after")
    def _as_chat(self) -> ResponsesRequest:
        """The chat request this one means, validated as the chat endpoint validates it."""
        body: dict[str, Any] = {"messages": self._messages(), "stream": self.stream}
        if self.max_output_tokens is not None:
            body["max_completion_tokens"] = self.max_output_tokens
        if self.tools:
            body["tools"] = [{"type": "function", "function": t.model_dump(
                exclude={"type"}, exclude_none=True)} for t in self.tools]
        if isinstance(self.tool_choice, NamedFunction):
            body["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        elif self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        fmt = self.text.format if self.text is not None else None
        if fmt is not None and fmt.type != "text":
            body["response_format"] = (
                {"type": "json_object"} if fmt.type == "json_object" else
                {"type": "json_schema",
                 "json_schema": fmt.model_dump(by_alias=True, exclude={"type"})})
        for name in ("temperature", "top_p", "parallel_tool_calls", "user", "seed", "top_k",
                     "min_p", "repetition_penalty", "speculation", "chat_template_kwargs",
                     "cache_salt", "priority"):
            if (value := getattr(self, name)) is not None:
                body[name] = value.model_dump() if hasattr(value, "model_dump") else value
        try:
            self._chat = ChatCompletionRequest.model_validate(body)
        except ValidationError as exc:  # one sentence, naming this API's fields
            first = exc.errors()[0]
            loc = [_FIELD_NAMES.get(str(p), str(p)) for p in first["loc"]]
            where = ".".join(loc)
            raise ValueError(f"{where + ': ' if where else ''}"
                             f"{first['msg'].removeprefix('Value error, ')}") from None
        return self

    def _messages(self) -> list[dict[str, Any]]:
        """The input as chat messages: an assistant's text and the function calls after it one
        assistant turn (as the chat endpoint receives it), each output a tool message."""
        messages: list[dict[str, Any]] = []
        if self.instructions is not None:
            messages.append({"role": "system", "content": self.instructions})
        items = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) \
            else self.input
        for item in items:
            if isinstance(item, MessageItem):
                messages.append({"role": item.role, "content": joined_text(item.content)})
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": None,
                                     "tool_calls": [call]})
            elif isinstance(item, FunctionCallOutputItem):
                messages.append({"role": "tool", "tool_call_id": item.call_id,
                                 "content": joined_text(item.output)})
        if not messages:
            raise ValueError("input has no message to answer")
        return messages

    @property
    def chat(self) -> ChatCompletionRequest:
        return self._chat
