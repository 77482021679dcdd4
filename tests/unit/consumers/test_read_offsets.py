"""Reading input records back by offset (restoring state that references its inputs) on the embedded bus."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers import runtime
from consumers.runtime import read_offsets
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
