"""``trainers.stage_input``: reading a stage's samples to their end, and the order of its passes."""

from __future__ import annotations

from orchard.bus import Record, TopicPartition
from trainers.stage_input import pass_order, read_to_end, unique_sorted

TP = TopicPartition("samples", 0)


class TrickleConsumer:
    """Returns one record per poll, with empty polls between, and skips offset 3 (a transaction marker)."""

    def __init__(self, offsets: list[int], end: int) -> None:
        self.batches: list[list[Record]] = []
        for offset in offsets:
            self.batches += [[], [Record("samples", 0, offset, 0, None, b"")]]
        self.end, self._position = end, offsets[0]

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        batch = self.batches.pop(0) if self.batches else []
        if batch:
            self._position = batch[-1].offset + 1
        elif not self.batches:
            self._position = self.end  # a fetch past the marker moves the position to the end
        return batch

    def position(self) -> dict[TopicPartition, int]:
        return {TP: self._position}


def test_records_are_read_until_the_position_reaches_the_end_not_until_a_poll_comes_back_empty() -> None:
    consumer = TrickleConsumer([0, 1, 2, 4, 5, 6], end=8)  # offset 3 and 7: transaction markers
    read = [record.offset for record in read_to_end(consumer, {TP: 6}, poll_timeout_s=0.01)]  # type: ignore[arg-type]
    assert read == [0, 1, 2, 4, 5]  # 6 is past the stage's end: the next stage's


def test_an_empty_stage_reads_nothing() -> None:
    consumer = TrickleConsumer([5], end=5)
    assert list(read_to_end(consumer, {TP: 5}, poll_timeout_s=0.01)) == []  # type: ignore[arg-type]


def test_duplicates_are_kept_once_in_key_order() -> None:
    items = [("b", 2), ("a", 5), ("b", 1), ("c", 0)]
    assert unique_sorted(items, key=lambda item: item, identity=lambda item: item[0]) == [("a", 5), ("b", 1), ("c", 0)]


def test_each_pass_has_its_own_seeded_order_over_the_same_items() -> None:
    items = [f"s{i:02d}" for i in range(20)]
    first, second = pass_order(items, "shuffle", 3, 0), pass_order(items, "shuffle", 3, 1)
    assert sorted(first) == sorted(second) == items and first != second != items
    assert pass_order(items, "shuffle", 3, 0) == first and pass_order(items, "shuffle", 4, 0) != first
    assert pass_order(items, "key", 3, 5) == items
