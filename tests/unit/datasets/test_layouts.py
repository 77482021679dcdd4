"""Dataset layouts: presets, --map overrides, JSON-column lookups, labels, and the rows they refuse."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchard.datasets.exceptions import DatasetError, RowError
from orchard.datasets.layouts import LAYOUTS, extract, layout_with_overrides, lookup, parse_success

CHAT = [
    {"role": "user", "content": "Fix it."},
    {"role": "assistant", "content": "Done."},
]


def test_presets_exist_for_every_supported_layout() -> None:
    assert sorted(LAYOUTS) == ["custom", "orchard", "orchard-gui", "orchard-swe", "swe-gym", "swe-smith"]
    assert LAYOUTS["orchard-swe"].columns() == {"messages", "tools", "verify_status", "metadata"}


def test_a_map_override_points_a_field_at_another_column() -> None:
    layout = layout_with_overrides("custom", ["conversations=messages", "label=success", "extra.score=signal.score"])
    row = {"conversations": CHAT, "label": "resolved", "extra": json.dumps({"score": 0.25})}
    fields = extract(row, layout)
    assert (fields.messages, fields.success, fields.reward, fields.signals) == (CHAT, True, 1.0, {"score": 0.25})


@pytest.mark.parametrize(
    ("name", "maps", "error"),
    [
        ("custom", [], "needs a mapping for messages, success"),
        ("custom", ["conversations"], "expected SOURCE=FIELD"),
        ("custom", ["a=colour"], "unknown field 'colour'"),
        ("nope", [], "unknown layout 'nope'"),
        ("orchard", ["a=messages"], "the orchard layout is fixed"),
    ],
)
def test_bad_layout_options_are_refused_naming_the_problem(name: str, maps: list[str], error: str) -> None:
    with pytest.raises(DatasetError, match=error):
        layout_with_overrides(name, maps)


def test_lookup_reads_keys_of_json_string_and_struct_columns() -> None:
    row = {"metadata": json.dumps({"a": {"b": 3}}), "struct": {"x": "y"}}
    assert (lookup(row, "metadata.a.b"), lookup(row, "struct.x"), lookup(row, "missing.key")) == (3, "y", None)
    with pytest.raises(RowError, match="metadata: invalid JSON"):
        lookup({"metadata": "{broken"}, "metadata.a")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, True), (0, False), (1.0, True), ("PASSED", True), ("resolved", True), ("failed", False), ("no", False)],
)
def test_success_labels_accept_bools_numbers_and_words(value: Any, expected: bool) -> None:
    assert parse_success(value, "label") is expected


def test_an_unreadable_label_is_a_row_error() -> None:
    with pytest.raises(RowError, match="verify_status: cannot read 'maybe' as a success label"):
        parse_success("maybe", "verify_status")


def test_orchard_swe_row_takes_identity_label_and_signals_from_its_columns() -> None:
    metadata = {"instance_id": "repo__1", "model": "teacher-a", "signals": {"tests_passed_fraction": 0.5}}
    row = {"messages": json.dumps(CHAT), "metadata": json.dumps(metadata), "verify_status": "failed"}
    fields = extract(row, LAYOUTS["orchard-swe"])
    assert (fields.messages, fields.success, fields.reward) == (CHAT, False, 0.0)
    assert (fields.task_id, fields.episode_id, fields.model) == ("repo__1", None, "teacher-a")
    assert fields.signals == {"tests_passed_fraction": 0.5}


def test_gui_steps_become_screenshot_turns_and_success_follows_the_judged_reward() -> None:
    steps = [
        {"screenshot": "s3://shots/0.png", "response": "click(12, 40)"},
        {"screenshot": "s3://shots/1.png", "response": "type('shoes')", "observation": "A search box."},
    ]
    fields = extract({"instruction": "Find shoes.", "steps": steps, "reward": 0.75}, LAYOUTS["orchard-gui"])
    assert fields.messages == [
        {"role": "user", "content": "Find shoes.\n[screenshot: s3://shots/0.png]"},
        {"role": "assistant", "content": "click(12, 40)"},
        {"role": "user", "content": "[screenshot: s3://shots/1.png]\nA search box."},
        {"role": "assistant", "content": "type('shoes')"},
    ]
    assert (fields.success, fields.reward) == (True, 0.75)
    assert fields.artifact_uris == ["s3://shots/0.png", "s3://shots/1.png"]
    assert extract({"steps": steps, "reward": 0.25}, LAYOUTS["orchard-gui"]).success is False


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"messages": "[]", "resolved": True}, "messages: expected a non-empty list"),
        ({"messages": [{"content": "hi"}], "resolved": True}, r"messages\[0\]: a message needs a string 'role'"),
        ({"messages": [{"role": "user", "content": "hi"}], "resolved": True}, "has no assistant message"),
        ({"messages": CHAT}, "resolved: the row has no success label"),
        ({"messages": CHAT, "resolved": True, "instance_id": 3, "reward": "high"}, "not a finite number"),
    ],
)
def test_malformed_rows_are_row_errors_naming_the_column(row: dict[str, Any], reason: str) -> None:
    layout = layout_with_overrides("swe-gym", ["reward=reward"])
    with pytest.raises(RowError, match=reason):
        extract(row, layout)
