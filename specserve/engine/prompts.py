"""Prompts into token ids: raw text as written, and conversations through the model's chat
template, rendered as vLLM renders them (offline `LLM.chat` and the server share this)."""

from __future__ import annotations

import codecs
import functools
import inspect
import logging
import re
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

logger = logging.getLogger("specserve")

# apply_chat_template's own arguments (tokenization, the template, tools, ...): a request's
# template kwargs set the template's variables, never these. The three that vLLM also takes
# from template kwargs (overriding the request's fields) are not among them.
_RENDERER_ARGS = frozenset(inspect.signature(PreTrainedTokenizerBase.apply_chat_template)
                           .parameters) - {"add_generation_prompt", "continue_final_message",
                                           "documents"} | {"messages", "conversations"}


def set_chat_template(tokenizer, template: str | None, model_name: str) -> None:
    """Give the tokenizer `template` (Jinja text, or a file holding it), as vLLM's
    --chat-template does; without one, warn at start-up if the model has none, rather than
    failing every chat request later with no hint of the cure."""
    if template is not None:
        path = Path(template).expanduser()
        try:
            is_file = path.is_file()
        except OSError:  # a template's text, too long to be a path
            is_file = False
        if is_file:
            template = path.read_text()
        elif "{" not in template:  # neither a file nor Jinja: a mistyped path
            raise ValueError(f"chat_template {template!r} is neither a file nor a Jinja "
                             "template")
        else:  # typed on a command line: "\n" there means a newline, as in vLLM
            template = codecs.decode(template, "unicode_escape")
        tokenizer.chat_template = template
    elif not getattr(tokenizer, "chat_template", None):
        logger.warning("%s has no chat template: chat requests will fail; pass one with "
                       "--chat-template (a file or the template's text)", model_name)


def encode_prompt(tokenizer, prompt: str, add_special_tokens: bool = True) -> list[int]:
    """A raw prompt's token ids, with the special tokens the tokenizer adds (a BOS for Llama
    and Mistral; none for SmolLM2), as vLLM and transformers encode a completion's prompt."""
    return tokenizer(prompt, add_special_tokens=add_special_tokens).input_ids


@functools.cache
def _added_special_tokens(tokenizer) -> tuple[int, int]:
    """How many special tokens encode_prompt adds before and after a text (a BOS: (1, 0))."""
    plain = tokenizer("x", add_special_tokens=False).input_ids
    full = tokenizer("x", add_special_tokens=True).input_ids
    for lead in range(len(full) - len(plain) + 1):
        if full[lead:lead + len(plain)] == plain:
            return lead, len(full) - lead - len(plain)
    return 0, 0


def truncate_prompt(ids: list[int], k: int, tokenizer=None) -> list[int]:
    """vLLM's truncate_prompt_tokens: the prompt's last k tokens. Given the tokenizer that
    encoded a text with its special tokens, those stay (a Llama prompt keeps its BOS), as
    transformers' left truncation keeps them."""
    if len(ids) <= k:
        return ids
    lead, tail = _added_special_tokens(tokenizer) if tokenizer is not None else (0, 0)
    if lead + tail >= k:
        return ids[-k:]
    body = ids[lead:len(ids) - tail]
    return ids[:lead] + body[len(body) - (k - lead - tail):] + ids[len(ids) - tail:]


def encode_chat(tokenizer, messages: list[dict], add_special_tokens: bool = False,
                **options: Any) -> list[int]:
    """The conversation's token ids, as render_chat renders it (the template writes its own
    special tokens: by default none are added, as in vLLM)."""
    return encode_prompt(tokenizer, render_chat(tokenizer, messages, **options),
                         add_special_tokens=add_special_tokens)


def render_chat(tokenizer, messages: list[dict], *, add_generation_prompt: bool = True,
                continue_final_message: bool = False, documents: list[dict] | None = None,
                tools: list[dict] | None = None,
                template_kwargs: dict[str, Any] | None = None) -> str:
    """The conversation rendered by the model's chat template: by default closed with the
    assistant's header, ready for the reply; with continue_final_message the last (assistant)
    message is left open for the reply to continue. tools: OpenAI's function tools, for a
    template that lists them (one that does not ignores them). template_kwargs: the template's
    own variables (vLLM's chat_template_kwargs). Raises ValueError for what the template or
    these options refuse."""
    kwargs = {"add_generation_prompt": add_generation_prompt,
              "continue_final_message": continue_final_message, "documents": documents,
              **(template_kwargs or {})}
    if reserved := sorted(_RENDERER_ARGS & kwargs.keys()):
        raise ValueError(f"chat_template_kwargs may not set {reserved[0]!r}: an argument of the "
                         "renderer, not a template variable")
    documents = kwargs["documents"]  # template kwargs may set them too (as in vLLM)
    if documents is not None and not (isinstance(documents, list) and all(
            isinstance(d, dict) and all(isinstance(v, str) for v in d.values())
            for d in documents)):
        raise ValueError("documents must be a list of objects with string values")
    if kwargs["continue_final_message"] and kwargs["add_generation_prompt"]:
        # As vLLM: a new assistant turn and the last message left open contradict each other.
        raise ValueError("continue_final_message needs add_generation_prompt to be false")
    messages = [_text_content(m) for m in messages]
    if not _knows_developer_role(str(tokenizer.chat_template)):
        # OpenAI's developer role is the system role under its new name; a template older than
        # it would print it as an unknown role (ChatML) or refuse it.
        messages = [{**m, "role": "system"} if m["role"] == "developer" else m
                    for m in messages]
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)
    except TemplateError as exc:  # e.g. a template that rejects the order of roles
        raise ValueError(f"the chat template refused these messages: {exc}") from exc
    except TypeError as exc:
        if not (template_kwargs or tools or any(m.get("tool_calls") for m in messages)):
            raise
        # a template variable, a tool or an earlier call the client gave the wrong JSON type
        # (a template iterating over a schema's properties): the client's mistake
        raise ValueError(f"the chat template failed on this request's variables, tools or "
                         f"earlier calls: {exc}") from exc


def _text_content(message: dict) -> dict:
    """OpenAI's content as a list of parts (offline or from the server), flattened: text parts
    joined by newlines (a template expects a string)."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
               for p in content):
        raise ValueError("message content must be a string or a list of "
                         '{"type": "text", "text": ...} parts')
    return {**message, "content": "\n".join(p["text"] for p in content)}


@functools.lru_cache(maxsize=8)
def _knows_developer_role(template: str) -> bool:
    """Whether the template names the role, as in `message['role'] == 'developer'`."""
    return re.search(r"""["']developer["']""", template) is not None
