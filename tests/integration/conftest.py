"""Fixtures for the bus conformance suite: one ``bus`` per backend, the Kafka one on the shared real broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard.bus import Bus, open_bus
from orchard.config import BusConfig, EmbeddedBusConfig, KafkaBusConfig


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def bus_config(request: pytest.FixtureRequest, tmp_path: Path) -> BusConfig:
    """The config of each backend in turn."""
    if request.param == "embedded":
        return EmbeddedBusConfig(path=tmp_path / "bus", session_timeout_ms=2000)
    return KafkaBusConfig(bootstrap_servers=request.getfixturevalue("kafka_bootstrap"))


@pytest.fixture
def bus(bus_config: BusConfig) -> Iterator[Bus]:
    """An open bus of each backend in turn."""
    opened = open_bus(bus_config)
    try:
        yield opened
    finally:
        opened.close()
