"""The changelog state store: staging per batch and per record, changelog records, restore of owned partitions."""

from __future__ import annotations

from consumers.state import PUT, ChangelogRecord, ChangelogStateStore
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
