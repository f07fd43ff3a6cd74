from __future__ import annotations

import dataclasses

import pytest

from specserve.bench.workloads import (
    WORKLOAD_NAMES,
    WorkloadItem,
    load_workload,
    rag_document,
    rag_prefix,
    validate_workload,
)

# Expected output lengths per workload (inclusive), sized for a small chat model.
MAX_TOKENS_RANGES = {
    "prose": (96, 256),
    "json": (48, 160),
    "sql": (32, 128),
    "rag": (32, 128),
    "chat-1": (48, 160),
    "json-schema": (48, 160),
}


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_workload_loads_and_validates(name: str) -> None:
    items = load_workload(name)
    assert len(items) >= 64
    validate_workload(items)
    lo, hi = MAX_TOKENS_RANGES[name]
    for item in items:
        assert isinstance(item, WorkloadItem)
        assert item.id.startswith(f"{name}-"), item.id
        assert lo <= item.max_tokens <= hi, item.id
        assert item.messages[-1]["role"] == "user"


def test_prompts_within_a_workload_are_distinct() -> None:
    for name in WORKLOAD_NAMES:
        contents = [item.messages[-1]["content"] for item in load_workload(name)]
        assert len(set(contents)) == len(contents), name


def test_rag_items_share_the_document_prefix() -> None:
    doc = rag_document()
    assert len(doc.split()) >= 1100
    prefix = rag_prefix()
    assert prefix.startswith("Answer the question using only the document below.\n\n<document>\n")
    assert prefix.endswith("\n</document>\n\nQuestion: ")
    for item in load_workload("rag"):
        assert len(item.messages) == 1
        content = item.messages[0]["content"]
        assert content.startswith(prefix)
        assert doc in content
        assert content[len(prefix) :].strip().endswith("?")


def test_unknown_workload_raises() -> None:
    with pytest.raises(ValueError,
                       match="known workloads: prose, json, sql, rag, chat-1, json-schema"):
        load_workload("poetry")


ASSISTANT_TURN = {"role": "assistant", "content": "Hello"}


def _good_item(**changes: object) -> WorkloadItem:
    item = WorkloadItem(id="x-001", messages=[{"role": "user", "content": "Hi"}], max_tokens=16)
    return dataclasses.replace(item, **changes)


def test_good_item_validates() -> None:
    validate_workload([_good_item(), _good_item(id="x-002")])


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([], "empty"),
        ([_good_item(), _good_item()], "duplicate"),
        ([_good_item(messages=[])], "non-empty list"),
        ([_good_item(messages=[{"role": "robot", "content": "Hi"}])], "role"),
        ([_good_item(messages=[{"role": "user", "content": "  "}])], "empty"),
        ([_good_item(messages=[{"role": "user"}])], "content"),
        (
            [_good_item(messages=[{"role": "user", "content": "Hi"}, ASSISTANT_TURN])],
            "last message",
        ),
        ([_good_item(max_tokens=0)], "max_tokens"),
        ([_good_item(max_tokens=4096)], "max_tokens"),
        ([_good_item(max_tokens=12.5)], "max_tokens"),
        ([_good_item(id="")], "id"),
    ],
)
def test_broken_items_fail_validation(items: list[WorkloadItem], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_workload(items)


def test_json_schema_holds_each_json_item_to_the_schema_its_prompt_lists() -> None:
    plain, constrained = load_workload("json"), load_workload("json-schema")
    assert [i.messages for i in plain] == [i.messages for i in constrained]
    first = constrained[0].structured_outputs
    assert first["disable_any_whitespace"] is True
    schema = first["json"]
    assert schema["required"] == ["name", "age", "occupation", "city", "languages"]
    assert schema["properties"]["age"] == {"type": "integer"}
    assert schema["properties"]["languages"] == {"type": "array", "items": {"type": "string"}}
    assert all(i.structured_outputs["json"]["required"] for i in constrained)
    assert all(i.structured_outputs is None for i in plain)
