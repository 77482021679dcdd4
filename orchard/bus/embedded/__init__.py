"""The embedded bus: a durable single-machine log on disk, shared by the processes of one machine."""

from orchard.bus.embedded.backend import EmbeddedBus

__all__ = ["EmbeddedBus"]
