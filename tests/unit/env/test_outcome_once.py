"""An episode gets exactly one outcome, also when a cancellation lands just after its outcome was sent."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from orchard.bus import open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.env.episode_runner import LocalEpisodeRunner, ProxyAdmin
from orchard.env.scheduler import Episode, EpisodeState
from orchard.env.tasks import TaskCatalog
from orchard.topics import OUTCOMES


class ClosedProxy(ProxyAdmin):
    """The proxy's admin routes answering at once (the episode has no calls)."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9", "token")

    async def close_episode(self, episode_id: str) -> dict[str, Any]:
        return {"calls_received": 0}


class NoSandboxes:
    """A runtime with nothing to delete."""

    def delete(self, sandbox_id: str) -> None:
        return None


def test_a_cancellation_after_the_outcome_was_sent_publishes_no_second_outcome(tmp_path: Path) -> None:
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    bus.create_topic(OUTCOMES, 1)
    (tmp_path / "tasks").mkdir()
    runner = LocalEpisodeRunner(
        runtime=NoSandboxes(),  # type: ignore[arg-type]
        tasks=TaskCatalog(tmp_path / "tasks"),
        proxy=ClosedProxy(),
        proxy_url="http://127.0.0.1:9",
        producer=bus.producer(),
        run_id="r",
    )
    episode = Episode("ep-1", {"task_id": "t", "harness": "builtin", "model": "m"})

    async def race() -> None:
        await runner._publish(episode, EpisodeState.SUCCEEDED, None, None, None)  # run() got this far
        await runner.report(episode, EpisodeState.CANCELLED, "cancelled")  # then the shutdown's cancellation

    asyncio.run(race())
    with bus.consumer([OUTCOMES], group=None, start="earliest") as consumer:
        records = consumer.poll(max_records=10, timeout_s=2.0)
    bus.close()
    statuses = [Codec.default().decode(r.value).record["status"] for r in records]
    assert statuses == ["SUCCEEDED"]
