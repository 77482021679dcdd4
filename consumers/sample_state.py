"""What the sample builder keeps in its state store while a trajectory waits for its scores and its group.

A raw trajectory is quadratic in its length (every call resends the whole context, as tokens and as messages),
so the builder stores a ``PreparedTrajectory`` instead, computed once on arrival: the outcome fields, the token
sequences (``consumers.sequences``: linear in the episode's length) and, when the builder makes SFT samples, each
call's ``StepFacts`` (what credit assignment needs). Both are pure functions of the trajectory; the facts are left
out (``None``) by a builder that only makes RL samples, since reading them from the transcript costs several times
more than everything else the builder does with a trajectory.

Encoding of a prepared trajectory: a 4-byte little-endian header length, the JSON header, then each sequence's
token ids (int32) and behaviour logprobs (float32), little-endian, in order.

Scores wait as ``ScoreBook``s, one per (episode, scorer): the scores received so far (abstentions dropped), how many
records came, how many the scorer said it published (``StepScore.episode_score_count``, v2: when its records say so),
when the first arrived and when the last announced one did.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from consumers.advantages import DenseScore
from consumers.credit import StepFacts, step_facts
from consumers.sequences import TokenSequence, build_sequences
from orchard.trajectory import Trajectory

_LENGTH = struct.Struct("<I")


@dataclass(frozen=True, slots=True, eq=False)
class PreparedTrajectory:
    """A trajectory reduced to what samples are built from, plus when it arrived (event time)."""

    run_id: str
    episode_id: str
    task_id: str
    group_id: str
    status: str | None
    reward: float
    success: bool
    signals: Mapping[str, float]
    arrived_ms: int
    sequences: tuple[TokenSequence, ...]
    facts: tuple[StepFacts, ...] | None  # None: not computed (a builder that makes no SFT samples)

    @classmethod
    def of(cls, trajectory: Trajectory, arrived_ms: int, *, facts: bool = True) -> PreparedTrajectory:
        """Prepare ``trajectory`` (which arrived at event time ``arrived_ms``); ``facts=False`` leaves the step
        facts out."""
        return cls(
            run_id=trajectory.run_id,
            episode_id=trajectory.episode_id,
            task_id=trajectory.task_id,
            group_id=trajectory.group_id,
            status=trajectory.status,
            reward=float(trajectory.reward),
            success=trajectory.success,
            signals=dict(trajectory.signals),
            arrived_ms=arrived_ms,
            sequences=tuple(build_sequences(trajectory.steps)),
            facts=step_facts(trajectory) if facts else None,
        )

    def to_bytes(self) -> bytes:
        """The stored form (see the module docstring)."""
        header = {
            "run_id": self.run_id,
            "episode_id": self.episode_id,
            "task_id": self.task_id,
            "group_id": self.group_id,
            "status": self.status,
            "reward": self.reward,
            "success": self.success,
            "signals": dict(self.signals),
            "arrived_ms": self.arrived_ms,
            "sequences": [sequence.header() for sequence in self.sequences],
            "facts": None if self.facts is None else [facts.to_json() for facts in self.facts],
        }
        encoded = json.dumps(header, separators=(",", ":")).encode()
        arrays = b"".join(
            s.token_ids.astype("<i4").tobytes() + s.logprobs.astype("<f4").tobytes() for s in self.sequences
        )
        return _LENGTH.pack(len(encoded)) + encoded + arrays

    @classmethod
    def from_bytes(cls, data: bytes) -> PreparedTrajectory:
        """The prepared trajectory ``to_bytes`` wrote."""
        (length,) = _LENGTH.unpack_from(data)
        header: dict[str, Any] = json.loads(data[_LENGTH.size : _LENGTH.size + length])
        offset, sequences = _LENGTH.size + length, []
        for seq_header in header["sequences"]:
            n = seq_header["length"]
            ids = np.frombuffer(data, dtype="<i4", count=n, offset=offset).astype(np.int32)
            logprobs = np.frombuffer(data, dtype="<f4", count=n, offset=offset + 4 * n).astype(np.float32)
            sequences.append(TokenSequence.from_header(seq_header, ids, logprobs))
            offset += 8 * n
        return cls(
            **{k: header[k] for k in ("run_id", "episode_id", "task_id", "group_id", "status", "reward", "success")},
            signals=header["signals"],
            arrived_ms=header["arrived_ms"],
            sequences=tuple(sequences),
            facts=None if header["facts"] is None else tuple(StepFacts.from_json(f) for f in header["facts"]),
        )


@dataclass(slots=True)
class ScoreBook:
    """The scores one scorer gave one episode so far (abstentions are not kept) and when the first arrived."""

    scorer: str
    first_ms: int
    scores: dict[tuple[int, int | None, int | None], float] = field(default_factory=dict)
    received: int = 0  # records taken (abstentions included)
    expected: int | None = None  # records the scorer published for the episode, when its records say
    complete_ms: int | None = None  # event time the ``expected``-th record came

    def add(
        self, call_index: int, token_start: int | None, token_end: int | None, score: float, *, now_ms: int
    ) -> None:
        """Take one score record; a NaN (abstention) only counts; a score for the same span overwrites."""
        if score == score:  # not NaN
            self.scores[(call_index, token_start, token_end)] = float(score)
        self.received += 1
        if self.complete_ms is None and self.expected is not None and self.received >= self.expected:
            self.complete_ms = now_ms

    def expect(self, count: int | None, now_ms: int) -> None:
        """The scorer published ``count`` records for this episode (None: it did not say)."""
        if count is not None and self.expected is None:
            self.expected = count
            if self.received >= count:
                self.complete_ms = now_ms

    def ready_ms(self, settle_ms: int) -> int | None:
        """Event time from which this scorer counts as done with the episode: when its announced count was reached
        (None while records it announced are still missing), or, when its records do not say how many there are,
        ``settle_ms`` after its first record (its records may straddle polls)."""
        if self.expected is not None:
            return self.complete_ms
        return self.first_ms + settle_ms

    def dense_scores(self) -> list[DenseScore]:
        """The scores as ``DenseScore``s, in a stable order."""
        return [DenseScore(self.scorer, c, v, s, e) for (c, s, e), v in sorted(self.scores.items(), key=_order)]

    def call_scores(self) -> dict[int, float]:
        """Call-level scores (no token span) by call index."""
        return {c: v for (c, s, e), v in self.scores.items() if s is None and e is None}

    def to_bytes(self) -> bytes:
        """The stored form (JSON)."""
        rows = [[c, s, e, v] for (c, s, e), v in sorted(self.scores.items(), key=_order)]
        counts = {"received": self.received, "expected": self.expected, "complete_ms": self.complete_ms}
        return json.dumps({"scorer": self.scorer, "first_ms": self.first_ms, "scores": rows, **counts}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ScoreBook:
        """The book ``to_bytes`` wrote."""
        value = json.loads(data)
        scores = {(c, s, e): v for c, s, e, v in value["scores"]}
        return cls(
            value["scorer"], value["first_ms"], scores, value["received"], value["expected"], value["complete_ms"]
        )


def _order(item: tuple[tuple[int, int | None, int | None], float]) -> tuple[int, int, int]:
    (call, start, end), _ = item
    return call, -1 if start is None else start, -1 if end is None else end
