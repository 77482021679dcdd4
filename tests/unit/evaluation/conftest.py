"""Fixtures of the evaluation tests: an embedded bus and synthetic ``EpisodeOutcome`` records."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard.bus import Bus, open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.topics import OUTCOMES


def make_outcome(
    episode_id: str,
    *,
    run_id: str = "run",
    task_id: str = "task",
    group_id: str = "g",
    success: bool = False,
    reward: float = 0.0,
    status: str | None = None,
    policy_version: int | None = None,
    ended_at: int = 1_700_000_000_000,
) -> dict[str, Any]:
    """One outcome record (status SUCCEEDED/FAILED from ``success`` unless given)."""
    return {
        "run_id": run_id,
        "episode_id": episode_id,
        "task_id": task_id,
        "group_id": group_id,
        "status": status or ("SUCCEEDED" if success else "FAILED"),
        "reward": reward,
        "success": success,
        "signals": {},
        "num_model_calls": 3,
        "artifact_uris": [],
        "policy_version": policy_version,
        "started_at": ended_at - 1000,
        "ended_at": ended_at,
        "error": None,
    }


def publish_outcomes(bus: Bus, outcomes: list[dict[str, Any]], topic: str = OUTCOMES) -> None:
    """Send ``outcomes`` to ``topic``, keyed by episode id as Env does."""
    codec = Codec.default()
    bus.create_topic(topic, exist_ok=True)
    with bus.producer() as producer:
        for record in outcomes:
            producer.send(topic, codec.encode("EpisodeOutcome", record), key=record["episode_id"].encode())


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[Bus]:
    """A fresh embedded bus."""
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as opened:
        yield opened


@pytest.fixture
def outcome() -> Callable[..., dict[str, Any]]:
    """``make_outcome``."""
    return make_outcome


@pytest.fixture
def publish(bus: Bus) -> Callable[..., None]:
    """``publish_outcomes`` on the test's bus."""

    def send(outcomes: list[dict[str, Any]], topic: str = OUTCOMES) -> None:
        publish_outcomes(bus, outcomes, topic)

    return send
