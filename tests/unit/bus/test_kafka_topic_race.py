"""A topic another client created a moment ago is waited for, not reported missing.

Three consumer instances starting together each ensure their changelog topic: one creates it, the others get
``TOPIC_ALREADY_EXISTS`` and then ask the broker for its partitions before the broker's metadata has it. The admin
client is replaced by a stub (pure logic: the real race lasts milliseconds on a broker and cannot be timed in a test).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from orchard.bus import TopicNotFoundError
from orchard.bus.kafka import backend
from orchard.config import KafkaBusConfig


@dataclass
class _Topic:
    partitions: dict[int, Any]
    error: Any = None


@dataclass
class _Metadata:
    topics: dict[str, _Topic]
    brokers: dict[int, Any] = field(default_factory=lambda: {1: object()})


class _Failed:
    def result(self) -> None:
        raise KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS))


class _LaggingAdmin:
    """An admin client whose metadata learns of topic ``t`` only on the ``visible_after``-th question about it."""

    def __init__(self, config: dict[str, Any], visible_after: int = 3) -> None:
        self.asked = 0
        self.visible_after = visible_after

    def list_topics(self, topic: str | None = None, timeout: float = 0) -> _Metadata:
        if topic is None:
            return _Metadata({})
        self.asked += 1
        return _Metadata({"t": _Topic({0: object(), 1: object()})} if self.asked >= self.visible_after else {})

    def create_topics(self, topics: list[Any], **_: Any) -> dict[str, _Failed]:
        return {topic.topic: _Failed() for topic in topics}


def _bus(monkeypatch: pytest.MonkeyPatch) -> backend.KafkaBus:
    monkeypatch.setattr(backend, "AdminClient", _LaggingAdmin)
    return backend.KafkaBus(KafkaBusConfig(bootstrap_servers="127.0.0.1:1", request_timeout_s=5))


def test_a_topic_another_client_just_created_is_waited_for_not_reported_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bus = _bus(monkeypatch)
    bus.create_topic("t", 2, exist_ok=True)
    assert bus.partitions("t") == 2


def test_a_topic_nobody_created_is_still_reported_missing_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    bus = _bus(monkeypatch)
    with pytest.raises(TopicNotFoundError, match="topic 'u' does not exist"):
        bus.partitions("u")
