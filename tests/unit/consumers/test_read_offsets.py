"""Reading input records back by offset (restoring state that references its inputs) on the embedded bus."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers import runtime
from consumers.runtime import StateRestoreError, read_offsets
from orchard.bus import open_bus
from orchard.config import EmbeddedBusConfig


@pytest.mark.parametrize("gap", [1000, 3])
def test_exactly_the_wanted_records_come_back_across_gaps_and_partitions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gap: int
) -> None:
    monkeypatch.setattr(runtime, "READ_GAP", gap)  # 3: every gap below is read as a range of its own
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        bus.create_topic("in", 2)
        producer = bus.producer()
        for partition in (0, 1):
            for offset in range(40):
                producer.produce("in", f"{partition}:{offset}".encode(), partition=partition)
        producer.flush()
        wanted = {0: [3, 4, 20, 39], 1: [0, 10, 11, 12, 38]}
        found = read_offsets(bus, "in", {**wanted, 1: [*wanted[1], 40, 41]}, poll_timeout_s=0.05, idle_polls=1)
        assert found == {(p, o): f"{p}:{o}".encode() for p, offsets in wanted.items() for o in offsets}


def test_a_held_record_that_does_not_come_back_is_read_again_then_raises_instead_of_being_reported_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    once = runtime._read_offsets_once
    passes: list[int] = []

    def dropping(*args: object, **kwargs: object) -> dict[tuple[int, int], bytes]:
        passes.append(1)
        found = once(*args, **kwargs)  # type: ignore[arg-type]
        found.pop((0, 5), None)  # as if the read had ended before the record arrived
        return found

    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        bus.create_topic("in", 1)
        producer = bus.producer()
        for offset in range(10):
            producer.produce("in", f"{offset}".encode(), partition=0)
        producer.flush()
        monkeypatch.setattr(runtime, "_read_offsets_once", dropping)
        with pytest.raises(StateRestoreError, match=r"1 records in still holds .*\(0, 5\)"):
            read_offsets(bus, "in", {0: [2, 5]}, poll_timeout_s=0.05, idle_polls=1)
        assert len(passes) == 2
        monkeypatch.setattr(runtime, "_read_offsets_once", once)
        found = read_offsets(bus, "in", {0: [2, 5, 12]}, poll_timeout_s=0.05, idle_polls=1)  # 12: past the end
        assert found == {(0, 2): b"2", (0, 5): b"5"}
