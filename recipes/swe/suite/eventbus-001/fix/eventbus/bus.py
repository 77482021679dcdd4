"""Topics, subscriptions and delivery."""

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Handler = Callable[[Any], None]


@dataclass(eq=False)
class _Subscription:
    handler: Handler
    once: bool


class EventBus:
    """Delivers payloads to the handlers of a topic, in subscription order."""

    def __init__(self) -> None:
        self._subs: dict[str, list[_Subscription]] = defaultdict(list)

    def subscribe(self, topic: str, handler: Handler, once: bool = False) -> Callable[[], None]:
        """Register ``handler``; the returned function unsubscribes it."""
        sub = _Subscription(handler, once)
        self._subs[topic].append(sub)
        return lambda: self._remove(topic, sub)

    def _remove(self, topic: str, sub: _Subscription) -> None:
        subs = self._subs.get(topic, [])
        if sub in subs:
            subs.remove(sub)

    def publish(self, topic: str, payload: Any) -> int:
        """Call each handler subscribed to ``topic`` now; return how many were called."""
        delivered = 0
        for sub in list(self._subs.get(topic, ())):
            if sub.once:
                self._remove(topic, sub)
            sub.handler(payload)
            delivered += 1
        return delivered
