"""Pick the bus backend named by the config's ``type``."""

from __future__ import annotations

from orchard.bus.base import Bus
from orchard.config import BusConfig, EmbeddedBusConfig, KafkaBusConfig


def open_bus(config: BusConfig) -> Bus:
    """Open the bus described by ``config`` (the Kafka backend is imported only when used)."""
    if isinstance(config, EmbeddedBusConfig):
        from orchard.bus.embedded import EmbeddedBus

        return EmbeddedBus(config)
    if isinstance(config, KafkaBusConfig):
        from orchard.bus.kafka import KafkaBus

        return KafkaBus(config)
    raise TypeError(f"unknown bus config {type(config).__name__}")
