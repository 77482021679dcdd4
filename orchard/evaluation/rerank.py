"""Value-model reranking in evaluation: best-of-K for held-out evaluation, and what ``orchard eval --rerank K
--source/--topic`` reads and writes.

Best-of-K: a ``Picker`` that lets the value-model reranker choose among a task's K finished episodes, reading their
``Trajectory`` records (assembled by the consumers) from the bus. Trajectories are assembled after the outcome is
published, so the picker waits for them, up to ``wait_s`` in total from its first call. An episode with no
trajectory by then cannot be scored and is not chosen; a task none of whose episodes can be scored falls back to its
first finished episode (a random pick), and the fallback is counted in ``fallbacks``.

Reranking recorded candidates: a run's trajectories read from a topic until it goes quiet (``read_run_trajectories``),
the newest published value model fetched from the store (``download_value_model``), and the picks written as JSON
lines (``write_picks``). Torch is only needed by the reranker and the value model, which ``trainers`` provides.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from orchard.artifacts import policy_artifact_name
from orchard.bus import Bus, Consumer, Record, read_until_quiet
from orchard.codec import Codec
from orchard.evaluation.exceptions import EvaluationError
from orchard.evaluation.heldout import EpisodeResult
from orchard.logging import get_logger
from orchard.rerank_candidates import Candidate, RerankResult
from orchard.serialization_errors import SerializationError
from orchard.topics import TRAJECTORIES
from orchard.trajectory import Trajectory
from orchard.trajectory_records import trajectory_from_record

if TYPE_CHECKING:
    from orchard.store import ArtifactStore

log = get_logger("orchard.evaluation.rerank")
TrajectoryFetch = Callable[[set[str], float], dict[str, Trajectory]]
"""Returns the trajectories of the given episode ids that are available before the deadline (a monotonic time)."""


class CandidateRanker(Protocol):
    """What the picker needs of ``trainers.rerank.Reranker``."""

    def pick(self, candidates: Sequence[Candidate]) -> RerankResult:
        """The best of ``candidates``."""


class ValuePicker:
    """A ``Picker`` choosing the episode the value model rates most likely to succeed.

    With ``keep_first_within`` (for candidates whose first is the greedy answer: ``--greedy-first``), the task's first
    episode stands unless the value model rates another more than that much higher (P(success) points). A value
    model rates every plausible episode about alike (0.985 against 0.985 in the file-lookup recipe), so a plain
    argmax decides among near-ties by noise and trades greedy answers that succeed for sampled ones that fail; the
    margin leaves such ties to greedy decoding, which succeeds more often than sampling.
    """

    def __init__(
        self,
        reranker: CandidateRanker,
        fetch: TrajectoryFetch,
        *,
        wait_s: float = 120.0,
        keep_first_within: float | None = None,
    ) -> None:
        if keep_first_within is not None and not 0.0 <= keep_first_within <= 1.0:
            raise ValueError(f"keep_first_within must be within [0, 1], got {keep_first_within}")
        self.reranker, self.fetch, self.wait_s = reranker, fetch, wait_s
        self.keep_first_within = keep_first_within
        self.fallbacks = 0
        self.overrides = 0
        self.kept_first = 0
        self._deadline: float | None = None

    def __call__(self, task_id: str, candidates: Sequence[EpisodeResult]) -> EpisodeResult:
        """The chosen episode of ``task_id``."""
        finished = [c for c in candidates if c.finished]
        if not finished:
            return candidates[0]
        if self._deadline is None:
            self._deadline = time.monotonic() + self.wait_s
        trajectories = self.fetch({c.episode_id for c in finished}, self._deadline)
        scored = [c for c in finished if c.episode_id in trajectories]
        if not scored:
            self.fallbacks += 1
            log.warning("no trajectories to rerank; first episode counts", task_id=task_id, episodes=len(finished))
            return finished[0]
        result = self.reranker.pick([Candidate.from_trajectory(trajectories[c.episode_id]) for c in scored])
        best = result.best_index
        if self.keep_first_within is not None and best != 0 and scored[0].index == 0:
            if result.scores[best] - result.scores[0] <= self.keep_first_within:
                self.kept_first += 1
                return scored[0]
            self.overrides += 1
        return scored[best]


class BusTrajectories:
    """A ``TrajectoryFetch`` over a run's trajectories topic; what it has read is kept for later calls."""

    def __init__(self, bus: Bus, run_id: str, topic: str = TRAJECTORIES) -> None:
        self.run_id = run_id
        self._codec = Codec.default()
        bus.create_topic(topic, exist_ok=True)
        self._consumer: Consumer = bus.consumer([topic], group=None, start="earliest")
        self._seen: dict[str, Trajectory] = {}

    def __call__(self, episode_ids: set[str], deadline: float) -> dict[str, Trajectory]:
        """The trajectories of ``episode_ids`` read by ``deadline`` (all of them if they arrive in time)."""
        while not episode_ids <= self._seen.keys():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._add(self._consumer.poll(timeout_s=min(1.0, remaining)))
        return {episode_id: self._seen[episode_id] for episode_id in episode_ids if episode_id in self._seen}

    def _add(self, records: Iterable[Record]) -> None:
        for record in records:
            try:
                decoded = self._codec.decode(record.value)
            except SerializationError:
                continue
            if decoded.name == "Trajectory" and decoded.record["run_id"] == self.run_id:
                trajectory = trajectory_from_record(decoded.record, self._codec)
                self._seen.setdefault(trajectory.episode_id, trajectory)

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()


def read_run_trajectories(bus: Bus, topic: str, run_id: str, *, idle_polls: int = 3) -> list[Trajectory]:
    """The ``Trajectory`` records of ``run_id`` on ``topic``, read from its start until ``idle_polls`` polls of up
    to a second in a row come back empty."""
    codec = Codec.default()
    found: list[Trajectory] = []
    with bus.consumer([topic], group=None, start="earliest") as consumer:
        for record in read_until_quiet(consumer, max_records=500, poll_timeout_s=1.0, idle_polls=idle_polls):
            decoded = codec.decode(record.value)
            if decoded.name == "Trajectory" and decoded.record["run_id"] == run_id:
                found.append(trajectory_from_record(decoded.record, codec))
    return found


def download_value_model(store: ArtifactStore, run_id: str, name: str, dest: Path) -> tuple[str, int]:
    """Download the newest version ``run_id`` published of value model ``name`` into ``dest`` (verified); its artifact
    name and version. ``EvaluationError`` if there is none."""
    artifact = policy_artifact_name(run_id, name)
    version = store.latest_version(artifact)
    if version is None:
        raise EvaluationError(f"no published value model {artifact} in {store.location}; pass --value-model")
    store.download_version(artifact, version, dest, verify=True)
    return artifact, version


def write_picks(path: Path, picks: Mapping[str, RerankResult]) -> None:
    """One JSON line per task, by task id: ``{"task_id", "candidate_id", "score"}`` of its pick."""
    with open(path, "w", encoding="utf-8") as out:
        for task_id, pick in sorted(picks.items()):
            row = {"task_id": task_id, "candidate_id": pick.best_id, "score": pick.best_score}
            out.write(json.dumps(row) + "\n")
