"""Everything the viewer knows of one run, kept current: the bus feed into the episode index, the run directory's
files, the store for artifacts. The app's routes only ask this object.

Reads are lazy and throttled: the bus is opened on the first request, and each request reads the records that
arrived since the last read, at most once per ``refresh_s`` (a page polling several endpoints reads the bus once).
A lock serialises reading and answering, since uvicorn runs sync routes in a thread pool.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from orchard.bus import Bus, open_bus
from orchard.codec import Codec
from orchard.config import OrchardConfig
from orchard.logging import get_logger
from orchard.store import ArtifactStore, StoreError, open_store
from orchard.topics import MODEL_CALLS, OUTCOMES, SAMPLES, SCORES, TRAJECTORIES
from orchard.viewer.curves import run_curves
from orchard.viewer.episode import episode_detail
from orchard.viewer.exceptions import NotFoundError
from orchard.viewer.feed import BusFeed
from orchard.viewer.filters import NO_STAGE, STATUSES, EpisodeFilter
from orchard.viewer.index import EpisodeIndex
from orchard.viewer.runfiles import RunFiles, Stage
from orchard.viewer.tokens import TokenMode, TokenText

log = get_logger("orchard.viewer")

TOPICS = (OUTCOMES, MODEL_CALLS, TRAJECTORIES, SAMPLES, SCORES)
MAX_ARTIFACT_BYTES = 256 * 1024


class RunView:
    """One run directory with its bus and store, as the viewer's routes see it."""

    def __init__(self, run_dir: Path, config: OrchardConfig, *, tokens: TokenMode = "auto", refresh_s: float = 2.0):
        self.run_dir, self.config, self.refresh_s = run_dir, config, refresh_s
        self.files = RunFiles(run_dir)
        self.tokens = TokenText.for_run(tokens, self.files.recipe_model())
        self.index = EpisodeIndex(Codec.default())
        self._bus: Bus | None = None
        self._feed: BusFeed | None = None
        self._store: ArtifactStore | None = None
        self._read_at = -float("inf")
        self._lock = threading.Lock()

    def refresh(self, *, force: bool = False) -> None:
        """Index the records that arrived since the last read (unless one happened under ``refresh_s`` ago)."""
        with self._lock:
            if not force and time.monotonic() - self._read_at < self.refresh_s:
                return
            if self._feed is None:
                self._bus = open_bus(self.config.bus)
                self._feed = BusFeed(self._bus, TOPICS)
            started = time.perf_counter()
            added = self.index.add_all(self._feed.read_new())
            self._read_at = time.monotonic()
            if added:
                log.info("indexed", records=added, episodes=len(self.index.episodes),
                         seconds=round(time.perf_counter() - started, 3))  # fmt: skip

    def run(self) -> dict[str, Any]:
        """The run's header: directory, run ids, stages with episode counts, and the values each filter can take."""
        self.refresh()
        stages = self.files.stages()
        rows = self._rows(stages)
        return {
            "run_dir": str(self.run_dir),
            "run_id": self.config.run_id,
            "bus": self.config.bus.type,
            "store": self.config.store.type,
            "token_mode": self.tokens.mode,
            "episodes": len(rows),
            "undecodable": dict(self.index.undecodable),
            "runs": _counts(row["run_id"] for row in rows),
            "stages": [{**stage.public(), "episodes": sum(r["stage"] == stage.name for r in rows)} for stage in stages],
            "choices": {
                "task": sorted({row["task_id"] for row in rows}),
                "status": list(STATUSES),
                "stage": [*(stage.name for stage in stages), NO_STAGE],
                "policy_version": sorted({row["policy_version"] for row in rows if row["policy_version"] is not None}),
            },
        }

    def episodes(self, selection: EpisodeFilter, *, limit: int, offset: int) -> dict[str, Any]:
        """The summary rows passing ``selection``, newest first, ``limit`` of them from ``offset``."""
        self.refresh()
        stages = self.files.stages()
        selection.check([stage.name for stage in stages])
        rows = [row for row in self._rows(stages) if selection.matches(row)]
        rows.sort(key=lambda row: (row["ended_ms"] or 0, row["episode_id"]), reverse=True)
        return {"total": len(rows), "offset": offset, "episodes": rows[offset : offset + limit]}

    def episode(self, episode_id: str) -> dict[str, Any]:
        """One episode turn by turn (``episode.episode_detail``); ``NotFoundError`` for an id the run does not have."""
        self.refresh()
        stages = self.files.stages()
        with self._lock:
            entry = self.index.episodes.get(episode_id)
            if entry is None or not entry.listed:
                raise NotFoundError(f"no episode {episode_id!r} in this run")
            return episode_detail(entry, entry.summary(stages), self.index.codec, self.tokens)

    def curves(self, window: int) -> dict[str, Any]:
        """Per-stage training curves, held-out rows and trainer loss (``curves.run_curves``)."""
        self.refresh()
        stages = self.files.stages()
        return run_curves(self._rows(stages), stages, self.files, window)

    def artifact(self, episode_id: str, number: int) -> tuple[str, bytes]:
        """The URI and (at most ``MAX_ARTIFACT_BYTES`` of) the content of the episode's ``number``-th artifact."""
        outcome = self.episode(episode_id)["outcome"] or {}
        uris = outcome.get("artifact_uris") or []
        if not 0 <= number < len(uris):
            raise NotFoundError(f"episode {episode_id!r} has {len(uris)} artifact(s); there is no number {number}")
        uri = uris[number]
        try:
            with self._open_store().open_read(self._store_key(uri)) as reader:
                return uri, reader.read(MAX_ARTIFACT_BYTES)
        except StoreError as exc:
            raise NotFoundError(f"artifact {uri!r} is not readable from the run's store: {exc}") from exc

    def close(self) -> None:
        """Close the bus feed, the bus and the store."""
        with self._lock:
            if self._feed is not None:
                self._feed.close()
            for handle in (self._bus, self._store):
                if handle is not None:
                    handle.close()
            self._feed = self._bus = self._store = None

    def _rows(self, stages: list[Stage]) -> list[dict[str, Any]]:
        with self._lock:
            return [entry.summary(stages) for entry in self.index.episodes.values() if entry.listed]

    def _open_store(self) -> ArtifactStore:
        if self._store is None:
            self._store = open_store(self.config.store)
        return self._store

    def _store_key(self, uri: str) -> str:
        """The store key of an artifact URI: the URI less the store's location, or the URI itself as a key."""
        location = self._open_store().location.rstrip("/") + "/"
        return uri[len(location) :] if uri.startswith(location) else uri.split("://", 1)[-1].lstrip("/")


def _counts(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts
