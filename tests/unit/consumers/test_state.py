"""The changelog state store: staging per batch and per record, changelog records, restore of owned partitions,
input records kept as references and read back on restore."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from consumers.processor import Input
from consumers.state import PUT, ChangelogRecord, ChangelogStateStore
from consumers.state_refs import REF, InputRef
from orchard.bus import Record


def as_records(changes: list[ChangelogRecord], topic: str = "g.changelog") -> list[Record]:
    return [Record(topic, c.partition, i, 0, c.key, c.value) for i, c in enumerate(changes)]


def test_changes_are_visible_in_the_batch_and_committed_only_with_it() -> None:
    store = ChangelogStateStore(partitions=4)
    store.begin_record(2)
    store.put("a", b"1")
    store.end_record()
    assert (store.get("a"), dict(store.items()), store.changelog()) == (
        b"1", {"a": b"1"}, [ChangelogRecord(2, b"a", PUT + b"1")],
    )  # fmt: skip
    store.rollback()
    assert (store.get("a"), list(store.items())) == (None, [])


def test_a_failed_record_leaves_no_partial_state() -> None:
    store = ChangelogStateStore(partitions=2)
    store.begin_record(0)
    store.put("kept", b"k")
    store.end_record()
    store.begin_record(1)
    store.put("kept", b"overwritten")
    store.put("new", b"n")
    store.rollback_record()
    assert dict(store.items()) == {"kept": b"k"}
    assert store.changelog() == [ChangelogRecord(0, b"kept", PUT + b"k")]


def test_a_key_written_from_another_partition_moves_and_restores_once() -> None:
    store = ChangelogStateStore(partitions=4)
    store.begin_record(1)
    store.put("k", b"v1")
    store.end_record()
    first = store.changelog()
    store.commit()
    store.begin_record(3)
    store.put("k", b"v2")
    store.end_record()
    second = store.changelog()
    store.commit()
    assert second == [ChangelogRecord(1, b"k", b""), ChangelogRecord(3, b"k", PUT + b"v2")]
    # partitions read in either order give the same state
    for order in (first + second, list(reversed(first + second))):
        restored = ChangelogStateStore(partitions=4)
        restored.restore(as_records(sorted(order, key=lambda c: c.partition)))
        assert dict(restored.items()) == {"k": b"v2"}


def test_restore_keeps_only_owned_partitions_and_applies_deletes() -> None:
    changes = [
        ChangelogRecord(0, b"a", PUT + b"1"),
        ChangelogRecord(1, b"b", PUT + b"2"),
        ChangelogRecord(0, b"a", b""),
        ChangelogRecord(0, b"c", PUT + b"3"),
    ]
    store = ChangelogStateStore(partitions=2)
    assert store.restore(as_records(changes), owned={0}) == 1
    assert dict(store.items()) == {"c": b"3"}


def test_punctuate_writes_stay_in_the_key_home_partition() -> None:
    store = ChangelogStateStore(partitions=4)
    store.begin_record(2)
    store.put("k", b"1")
    store.end_record()
    store.commit()
    store.begin_record(None)
    store.delete("k")
    store.put("fresh", b"x")
    store.end_record()
    [delete, fresh] = store.changelog()
    assert delete == ChangelogRecord(2, b"k", b"")
    assert fresh.key == b"fresh" and 0 <= fresh.partition < 4


# ----------------------------------------------------------------------------------------------- input references
def message(topic: str, partition: int, offset: int, value: bytes) -> Input:
    return Input(topic, "ModelCall", {}, b"k", 0, partition, offset, value)


def test_put_input_writes_where_the_record_is_and_restore_reads_it_back() -> None:
    inputs = {InputRef("model-calls", 1, 7): b"call seven " * 100, InputRef("outcomes", 1, 2): b"outcome"}
    store = ChangelogStateStore(partitions=2)
    store.begin_record(1)
    store.put_input("c/7", message("model-calls", 1, 7, inputs[InputRef("model-calls", 1, 7)]), b"stamp:")
    store.put_input("o", message("outcomes", 1, 2, b"outcome"))
    store.put("plain", b"p")
    store.end_record()
    changes = store.changelog()
    assert [(c.key, c.value[:1], len(c.value) < 64) for c in changes] == [
        (b"c/7", REF, True), (b"o", REF, True), (b"plain", PUT, True),
    ]  # fmt: skip
    asked: list[set[InputRef]] = []

    def resolve(refs: Iterable[InputRef]) -> dict[InputRef, bytes]:
        asked.append(set(refs))
        return {ref: inputs[ref] for ref in refs}

    restored = ChangelogStateStore(partitions=2)
    assert restored.restore(as_records(changes), resolve=resolve) == 3
    assert dict(restored.items()) == {
        "c/7": b"stamp:" + inputs[InputRef("model-calls", 1, 7)], "o": b"outcome", "plain": b"p",
    }  # fmt: skip
    assert (asked, restored.lost_keys, restored.home("c/7")) == ([set(inputs)], [], 1)


def test_a_referenced_record_that_is_gone_or_different_is_lost_never_replaced() -> None:
    store = ChangelogStateStore(partitions=1)
    store.begin_record(0)
    store.put_input("gone", message("model-calls", 0, 1, b"first"))
    store.put_input("other", message("model-calls", 0, 2, b"second"))
    store.put_input("kept", message("model-calls", 0, 3, b"third"))
    store.end_record()
    changes = store.changelog()
    now_held = {InputRef("model-calls", 0, 2): b"a recreated topic's record", InputRef("model-calls", 0, 3): b"third"}
    restored = ChangelogStateStore(partitions=1)
    assert restored.restore(as_records(changes), resolve=lambda refs: {r: now_held[r] for r in refs if r in now_held})
    assert (dict(restored.items()), restored.lost_keys) == ({"kept": b"third"}, ["gone", "other"])
    # the next commit deletes the lost keys' references, so a later restore cannot bring them back
    assert sorted((c.key, c.value) for c in restored.changelog()) == [(b"gone", b""), (b"other", b"")]
    restored.commit()
    assert (restored.home("gone"), restored.dirty, dict(restored.items())) == (None, False, {"kept": b"third"})
    with pytest.raises(ValueError, match="3 references to input records and no reader"):
        ChangelogStateStore(partitions=1).restore(as_records(changes))


def test_a_failed_record_restores_the_reference_it_overwrote() -> None:
    store = ChangelogStateStore(partitions=1)
    store.begin_record(0)
    store.put_input("k", message("model-calls", 0, 5, b"five"))
    store.end_record()
    before = store.changelog()
    store.begin_record(0)
    store.put("k", b"plain overwrite")
    store.rollback_record()
    assert (store.get("k"), store.changelog()) == (b"five", before)
    store.begin_record(0)
    store.put_input("k", message("model-calls", 0, 6, b"six"))
    store.put("k", b"plain after a reference")
    store.end_record()
    assert store.changelog() == [ChangelogRecord(0, b"k", PUT + b"plain after a reference")]


def test_a_damaged_reference_is_an_error_not_a_silent_loss() -> None:
    with pytest.raises(ValueError, match="damaged state reference"):
        ChangelogStateStore().restore(as_records([ChangelogRecord(0, b"k", REF + b"\x05")]), resolve=dict)
