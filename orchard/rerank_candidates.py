"""What a reranker chooses among and what it answers: ``Candidate`` solutions of one task and the ``RerankResult``.

``trainers.rerank.Reranker`` scores candidates with the value model; the held-out evaluation's best-of-K picker
(``orchard.evaluation.rerank``) hands it candidates and reads the result without importing the trainers (or torch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from orchard.trajectory import Trajectory

CandidateContent = Trajectory | str | npt.NDArray[np.integer]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One candidate solution: its id (unique among the task's candidates) and what the value model reads."""

    candidate_id: str
    content: CandidateContent

    @classmethod
    def from_trajectory(cls, trajectory: Trajectory) -> Candidate:
        """A trajectory as a candidate, identified by its episode id."""
        return cls(trajectory.episode_id, trajectory)


@dataclass(frozen=True, slots=True)
class RerankResult:
    """The pick: the winning candidate's id and index (in the order given), and every candidate's score."""

    best_id: str
    best_index: int
    scores: tuple[float, ...]

    @property
    def best_score(self) -> float:
        """The winner's score."""
        return self.scores[self.best_index]
