"""The trajectory assembler: joins each episode's ``ModelCall``s and its ``EpisodeOutcome`` into one ``Trajectory``.

Calls and outcomes arrive in any order, interleaved with thousands of other episodes, possibly more than once.
An episode is emitted (to ``trajectories``, keyed by task: ``stream_key``) exactly once:

- **complete**, as soon as its outcome and ``num_model_calls`` distinct calls are there. Distinct calls are
  counted rather than indices 0..n-1 checked, because a call the proxy failed to publish uses up its index
  (``EpisodeRecorder``): an episode may legitimately have calls 0, 2, 3 and ``num_model_calls`` 3;
- **incomplete**, with the reason, when its outcome has not come ``outcome_timeout_s`` after its latest call,
  or its calls are still missing ``calls_timeout_s`` after its outcome (never silently dropped).

A duplicate (same episode and call index, or a second outcome) is ignored. After an episode is emitted it is
remembered for ``closed_retention_s``: a late duplicate of a complete one is ignored; a late record of an
incomplete one goes to the dead letters (its trajectory is already out).

State (``StateStore``; every value starts with the 8-byte bus timestamp of the input that wrote it):

- ``c/<call_index>/<episode>``: the call's record exactly as read (``put_input``: the changelog holds where the
  record is in ``model-calls``, not a second copy of its bytes);
- ``o/<episode>``: the outcome's record exactly as read (likewise);
- ``d/<episode>``: the episode was emitted (value: timestamp + ``1`` complete or ``0`` incomplete).

The in-memory index (open episodes, their calls, deadlines) is rebuilt from the store in ``open``.
Time fields derive from input timestamps and ``punctuate``'s ``now``, so a replay emits identical records.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, ClassVar

from consumers.config import AssemblerConfig
from consumers.processor import Emit, Input, Processor, RecordRejected, StateStore
from orchard.bus import RecordTooLargeError
from orchard.codec import Codec
from orchard.episode_groups import stream_key
from orchard.logging import get_logger
from orchard.topics import MODEL_CALLS, OUTCOMES, TRAJECTORIES
from orchard.trajectory_records import trajectory_record

log = get_logger("consumers.assembler")
STAMP = struct.Struct(">q")


@dataclass(slots=True)
class OpenEpisode:
    """What the assembler knows of an episode it has not emitted yet."""

    run_id: str
    task_id: str
    calls: set[int] = field(default_factory=set)
    last_call_ms: int | None = None
    latest_call_index: int = -1
    call_policy_version: int | None = None
    outcome: dict[str, Any] | None = None
    outcome_ms: int | None = None

    def deadline(self, config: AssemblerConfig) -> int:
        """When the episode times out if it does not complete first."""
        if self.outcome_ms is not None:
            return self.outcome_ms + int(config.calls_timeout_s * 1000)
        return (self.last_call_ms or 0) + int(config.outcome_timeout_s * 1000)

    @property
    def complete(self) -> bool:
        """Whether the outcome and every call it announces are there."""
        return self.outcome is not None and len(self.calls) >= self.outcome["num_model_calls"]


class TrajectoryAssembler(Processor):
    """Joins calls and outcomes per episode and emits each episode's trajectory once."""

    name: ClassVar[str] = "assembler"
    input_topics: ClassVar[tuple[str, ...]] = (MODEL_CALLS, OUTCOMES)
    output_topics: ClassVar[tuple[str, ...]] = (TRAJECTORIES,)

    def __init__(self, config: AssemblerConfig | None = None, codec: Codec | None = None) -> None:
        """Timeouts and retention from ``config``."""
        self.config = config or AssemblerConfig()
        self.codec = codec or Codec.default()
        self.state: StateStore | None = None
        self.open_episodes: dict[str, OpenEpisode] = {}
        self.closed: dict[str, int] = {}  # episode id -> when it was emitted
        self.duplicates = 0

    # ------------------------------------------------------------------ restore
    def open(self, state: StateStore) -> None:
        """Rebuild the index of open and recently emitted episodes from the store."""
        self.state, self.open_episodes, self.closed = state, {}, {}
        for key, value in state.items():
            kind, _, rest = key.partition("/")
            stamp = STAMP.unpack_from(value)[0]
            if kind == "d":
                self.closed[rest] = stamp
            elif kind == "c":
                index, _, episode_id = rest.partition("/")
                self._note_call(episode_id, self.codec.decode(value[STAMP.size :]).record, stamp)
            elif kind == "o":
                self._note_outcome(rest, self.codec.decode(value[STAMP.size :]).record, stamp)

    def _episode(self, episode_id: str, record: dict[str, Any] | Any) -> OpenEpisode:
        episode = self.open_episodes.get(episode_id)
        if episode is None:
            episode = self.open_episodes[episode_id] = OpenEpisode(record["run_id"], record["task_id"])
        return episode

    def _note_call(self, episode_id: str, record: Any, stamp: int) -> None:
        episode = self._episode(episode_id, record)
        episode.calls.add(record["call_index"])
        episode.last_call_ms = max(episode.last_call_ms or stamp, stamp)
        if record["call_index"] > episode.latest_call_index:
            episode.latest_call_index = record["call_index"]
            episode.call_policy_version = record["policy_version"]

    def _note_outcome(self, episode_id: str, record: Any, stamp: int) -> None:
        episode = self._episode(episode_id, record)
        episode.outcome, episode.outcome_ms = dict(record), stamp

    # ------------------------------------------------------------------ process
    def process(self, message: Input, emit: Emit) -> None:
        """Add a call or an outcome to its episode; emit the trajectory if that completes it."""
        state = self._state()
        record = message.record
        episode_id = record["episode_id"]
        if episode_id in self.closed:
            self._late(episode_id, message)
            return
        if message.schema == "ModelCall":
            key = f"c/{record['call_index']}/{episode_id}"
            episode = self.open_episodes.get(episode_id)
            if episode is not None and record["call_index"] in episode.calls:
                self.duplicates += 1
                return
            state.put_input(key, message, STAMP.pack(message.timestamp_ms))
            self._note_call(episode_id, record, message.timestamp_ms)
        else:
            episode = self.open_episodes.get(episode_id)
            if episode is not None and episode.outcome is not None:
                self.duplicates += 1
                return
            state.put_input(f"o/{episode_id}", message, STAMP.pack(message.timestamp_ms))
            self._note_outcome(episode_id, record, message.timestamp_ms)
        if self.open_episodes[episode_id].complete:
            self._emit(episode_id, message.timestamp_ms, None, emit)

    def _late(self, episode_id: str, message: Input) -> None:
        closed = self._state().get(f"d/{episode_id}")
        if closed is not None and closed[STAMP.size :] == b"1":
            self.duplicates += 1  # the trajectory had everything: this is a duplicate
            return
        what = f"call {message.record['call_index']}" if message.schema == "ModelCall" else "outcome"
        raise RecordRejected(
            f"{what} of episode {episode_id} arrived after the episode was emitted as incomplete", "LateRecord"
        )

    # ------------------------------------------------------------------ time
    def punctuate(self, now_ms: int, emit: Emit) -> None:
        """Emit episodes past their deadline as incomplete; forget emitted episodes past retention."""
        expired = sorted(
            (deadline, episode_id)
            for episode_id, episode in self.open_episodes.items()
            if (deadline := episode.deadline(self.config)) <= now_ms
        )
        for deadline, episode_id in expired:
            self._emit(episode_id, deadline, self._reason(self.open_episodes[episode_id]), emit)
        horizon = now_ms - int(self.config.closed_retention_s * 1000)
        for episode_id in [e for e, at in self.closed.items() if at <= horizon]:
            self._state().delete(f"d/{episode_id}")
            del self.closed[episode_id]

    def _reason(self, episode: OpenEpisode) -> str:
        if episode.outcome is None:
            return (
                f"no outcome within {self.config.outcome_timeout_s:g}s of the episode's latest model call "
                f"({len(episode.calls)} calls received)"
            )
        return (
            f"{len(episode.calls)} of {episode.outcome['num_model_calls']} model calls arrived within "
            f"{self.config.calls_timeout_s:g}s of the outcome"
        )

    # ------------------------------------------------------------------ emit
    def _emit(self, episode_id: str, at_ms: int, reason: str | None, emit: Emit) -> None:
        state = self._state()
        episode = self.open_episodes.pop(episode_id)
        calls = []
        for index in sorted(episode.calls):
            key = f"c/{index}/{episode_id}"
            calls.append(_payload(state.get(key)))
            state.delete(key)
        outcome = _payload(state.get(f"o/{episode_id}")) if episode.outcome is not None else None
        state.delete(f"o/{episode_id}")
        version = episode.outcome.get("policy_version") if episode.outcome is not None else None
        fields = dict(
            run_id=episode.run_id, episode_id=episode_id, task_id=episode.task_id, calls=calls, outcome=outcome,
            outcome_fields=episode.outcome, timestamp_ms=at_ms,
            policy_version=version if version is not None else episode.call_policy_version,
        )  # fmt: skip
        key = stream_key(episode.task_id)
        try:
            emit(TRAJECTORIES, "Trajectory", trajectory_record(**fields, incomplete_reason=reason), key)
        except RecordTooLargeError as exc:
            # Emitted without its calls, so the episode is accounted for and the stream moves on.
            reason = f"trajectory too large for one record ({exc}); calls dropped"
            log.error("trajectory too large", episode_id=episode_id, error=str(exc))
            fields["calls"] = []
            emit(TRAJECTORIES, "Trajectory", trajectory_record(**fields, incomplete_reason=reason), key)
        complete = reason is None
        state.put(f"d/{episode_id}", STAMP.pack(at_ms) + (b"1" if complete else b"0"))
        self.closed[episode_id] = at_ms

    def _state(self) -> StateStore:
        if self.state is None:
            raise RuntimeError("the assembler was not opened with a state store")
        return self.state


def _payload(value: bytes | None) -> bytes:
    if value is None:
        raise RuntimeError("assembler state lost a record it indexed")
    return value[STAMP.size :]
