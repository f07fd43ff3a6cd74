"""Benchmark workloads: chat prompts with an expected output length.

Each workload is a JSON Lines file in ``workloads/`` next to this module. A line is
``{"id": ..., "messages": [...], "max_tokens": N}``. The ``rag`` workload is the exception: its
lines hold only a ``question``, and every prompt is built from one shared document
(``rag_document.md``) placed first, so all rag prompts share a long common prefix.
``json-schema`` has no file: it is ``json`` under structured outputs, each item held to the
schema its prompt spells out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

WORKLOAD_NAMES = ("prose", "json", "sql", "rag", "chat-1", "json-schema")
CONSTRAINED_WORKLOADS = ("json-schema",)  # run under structured outputs
WORKLOAD_DIR = Path(__file__).with_name("workloads")
RAG_DOCUMENT_FILE = "rag_document.md"
VALID_ROLES = frozenset({"system", "user", "assistant"})
MAX_TOKENS_LIMIT = 1024


@dataclass(frozen=True)
class WorkloadItem:
    id: str
    messages: list[dict]
    max_tokens: int
    # StructuredOutputsParams' fields as a dict, for a constrained workload (json-schema)
    structured_outputs: dict | None = None


@cache
def rag_document() -> str:
    """The shared document that every rag prompt starts with."""
    return (WORKLOAD_DIR / RAG_DOCUMENT_FILE).read_text(encoding="utf-8").strip()


def rag_prefix() -> str:
    """The text that every rag prompt's user message begins with."""
    return (
        "Answer the question using only the document below.\n\n<document>\n"
        + rag_document()
        + "\n</document>\n\nQuestion: "
    )


def _item_from_record(name: str, record: dict) -> WorkloadItem:
    if name == "rag":
        content = rag_prefix() + record["question"]
        messages = [{"role": "user", "content": content}]
    else:
        messages = record["messages"]
    return WorkloadItem(id=record["id"], messages=messages, max_tokens=record["max_tokens"])


_SCHEMA_LINE = re.compile(r"^- (\w+): (.+)$", re.MULTILINE)
_SCALAR_TYPES = frozenset({"string", "integer", "number", "boolean"})  # as JSON schema names them


def json_schema(item: WorkloadItem) -> dict:
    """The JSON schema that a json item's prompt spells out as a list of "- key: type" lines,
    every key required and in that order, for running the workload under structured outputs.
    Nested types the prompt describes in words ("array of objects with ...") are kept only
    as array or object. Where the prompt says to use null for what the text does not say,
    every value may be null."""
    text = item.messages[-1]["content"]
    nullable = "null" in text
    props: dict[str, dict] = {}
    for key, kind in _SCHEMA_LINE.findall(text):
        if kind in _SCALAR_TYPES:
            prop = {"type": kind}
        elif kind == "array of strings":
            prop = {"type": "array", "items": {"type": "string"}}
        else:
            prop = {"type": "array" if kind.startswith("array") else "object"}
        if nullable:
            prop["type"] = [prop["type"], "null"]
        props[key] = prop
    if not props:
        raise ValueError(f"{item.id}: the prompt lists no '- key: type' lines")
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


def load_workload(name: str) -> list[WorkloadItem]:
    """Load, build and validate the named workload."""
    if name not in WORKLOAD_NAMES:
        raise ValueError(f"unknown workload {name!r}; known workloads: {', '.join(WORKLOAD_NAMES)}")
    if name == "json-schema":
        # The json items held to the schema each prompt spells out, in compact JSON: what
        # a service asking for `response_format` json_schema runs.
        return [replace(item, id="json-schema-" + item.id.removeprefix("json-"),
                        structured_outputs={"json": json_schema(item),
                                            "disable_any_whitespace": True})
                for item in load_workload("json")]
    path = WORKLOAD_DIR / f"{name}.jsonl"
    items = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(_item_from_record(name, json.loads(line)))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path.name}:{lineno}: malformed workload line: {exc}") from exc
    validate_workload(items)
    return items


def validate_workload(items: list[WorkloadItem]) -> None:
    """Raise ValueError if ids repeat or any item has bad messages or max_tokens."""
    if not items:
        raise ValueError("workload is empty")
    seen: set[str] = set()
    for item in items:
        if not isinstance(item.id, str) or not item.id:
            raise ValueError(f"item id must be a non-empty string, got {item.id!r}")
        if item.id in seen:
            raise ValueError(f"duplicate item id {item.id!r}")
        seen.add(item.id)
        if not isinstance(item.messages, list) or not item.messages:
            raise ValueError(f"{item.id}: messages must be a non-empty list")
        for i, msg in enumerate(item.messages):
            if not isinstance(msg, dict) or msg.get("role") not in VALID_ROLES:
                roles = ", ".join(sorted(VALID_ROLES))
                raise ValueError(f"{item.id}: message {i} role must be one of {roles}")
            content = msg.get("content")
            if not isinstance(content, str) or not content.strip():
                raise ValueError(f"{item.id}: message {i} has empty or non-string content")
        if item.messages[-1]["role"] != "user":
            raise ValueError(f"{item.id}: last message must come from the user")
        tokens = item.max_tokens
        if isinstance(tokens, bool) or not isinstance(tokens, int):
            raise ValueError(f"{item.id}: max_tokens must be an integer, got {tokens!r}")
        if not 1 <= tokens <= MAX_TOKENS_LIMIT:
            raise ValueError(f"{item.id}: max_tokens {tokens} not in 1..{MAX_TOKENS_LIMIT}")
