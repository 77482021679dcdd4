"""In-process event bus."""

from eventbus.bus import EventBus

__all__ = ["EventBus"]
