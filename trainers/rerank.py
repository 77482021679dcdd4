"""Value-model reranking: of K candidate solutions of one task, pick the one the value model rates most likely to pass.

A candidate is a finished trajectory, a final patch (or any text, tokenized with the value model's tokenizer) or a
token sequence. Scores are P(success). The pick is deterministic: the highest score wins, and candidates within
``tie_tolerance`` of it are tied (batched inference may differ from one-at-a-time inference in the last bits), in
which case the smallest candidate id wins, so the pick does not depend on the order the candidates came in.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from orchard.rerank_candidates import Candidate, CandidateContent, RerankResult
from orchard.trajectory import Trajectory
from trainers.value import TokenIds, ValueModel


class Reranker:
    """Scores candidates with a value model and picks the best; see the module docstring for the tie rule."""

    def __init__(self, model: ValueModel, *, batch_size: int = 16, tie_tolerance: float = 1e-6) -> None:
        if tie_tolerance < 0:
            raise ValueError(f"tie_tolerance must be >= 0, got {tie_tolerance}")
        self.model = model
        self.batch_size = batch_size
        self.tie_tolerance = tie_tolerance

    def tokens(self, candidate: Candidate) -> TokenIds:
        """What the value model reads of ``candidate``."""
        content = candidate.content
        if isinstance(content, Trajectory):
            return self.model.encode_trajectory(content)
        if isinstance(content, str):
            return self.model.encode_text(content)
        return np.asarray(content, dtype=np.int64)[-self.model.max_length :]

    def score(self, candidates: Sequence[Candidate]) -> list[float]:
        """P(success) of each candidate, in order."""
        sequences = [self.tokens(candidate) for candidate in candidates]
        return [float(p) for p in self.model.predict(sequences, batch_size=self.batch_size)]

    def pick(self, candidates: Sequence[Candidate]) -> RerankResult:
        """The best of ``candidates`` (at least one; ids unique)."""
        if not candidates:
            raise ValueError("reranking needs at least one candidate")
        ids = [candidate.candidate_id for candidate in candidates]
        if len(set(ids)) != len(ids):
            raise ValueError(f"candidate ids must be unique, got {sorted(ids)}")
        scores = self.score(candidates)
        return select_best(ids, scores, self.tie_tolerance)


def select_best(ids: Sequence[str], scores: Sequence[float], tie_tolerance: float = 1e-6) -> RerankResult:
    """The highest score, ties (within ``tie_tolerance`` of the top) to the smallest id.

    >>> select_best(["b", "a", "c"], [0.7, 0.7, 0.2]).best_id
    'a'
    """
    top = max(scores)
    tied = [index for index, score in enumerate(scores) if score >= top - tie_tolerance]
    best = min(tied, key=lambda index: ids[index])
    return RerankResult(best_id=ids[best], best_index=best, scores=tuple(scores))


@dataclass(frozen=True, slots=True)
class LabelledCandidate:
    """A candidate of a task, with whether it actually succeeded when that is known (for evaluation)."""

    task_id: str
    candidate: Candidate
    success: bool | None = None


@dataclass
class RerankReport:
    """What reranking K candidates per task achieved: the picks, and success rates when labels are known.

    ``picked_success`` is the success rate of the picks; ``mean_success`` what a random pick achieves on average
    (the mean over each task's K candidates); ``oracle_success`` the share of tasks with any successful candidate.
    """

    picks: dict[str, RerankResult] = field(default_factory=dict)
    picked_success: float | None = None
    mean_success: float | None = None
    oracle_success: float | None = None


def rerank_tasks(reranker: Reranker, candidates: Iterable[LabelledCandidate], k: int) -> RerankReport:
    """Pick the best of the first ``k`` candidates of every task (in the order given); score the picks if labelled."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    by_task: dict[str, list[LabelledCandidate]] = {}
    for item in candidates:
        group = by_task.setdefault(item.task_id, [])
        if len(group) < k:
            group.append(item)
    report = RerankReport()
    picked, mean, oracle = [], [], []
    for task_id in sorted(by_task):
        group = by_task[task_id]
        result = reranker.pick([item.candidate for item in group])
        report.picks[task_id] = result
        labels = [item.success for item in group]
        if all(label is not None for label in labels):
            picked.append(float(bool(labels[result.best_index])))
            mean.append(sum(bool(label) for label in labels) / len(labels))
            oracle.append(float(any(labels)))
    if picked:
        report.picked_success = sum(picked) / len(picked)
        report.mean_success = sum(mean) / len(mean)
        report.oracle_success = sum(oracle) / len(oracle)
    return report


def read_candidates_jsonl(path: Path) -> list[LabelledCandidate]:
    """Candidates from JSON lines ``{"task_id", "candidate_id", "text" | "token_ids", "success"?}``."""
    items = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                items.append(_candidate_from_json(json.loads(line), f"{path}:{number}"))
    return items


def _candidate_from_json(data: Mapping[str, object], where: str) -> LabelledCandidate:
    for name in ("task_id", "candidate_id"):
        if not isinstance(data.get(name), str) or not data[name]:
            raise ValueError(f"{where}: field {name!r} must be a non-empty string")
    content: CandidateContent
    if isinstance(data.get("text"), str):
        content = str(data["text"])
    elif isinstance(data.get("token_ids"), list):
        content = np.asarray(data["token_ids"], dtype=np.int64)
    else:
        raise ValueError(f"{where}: a candidate needs 'text' (a string) or 'token_ids' (a list of ints)")
    success = data.get("success")
    if success is not None and not isinstance(success, bool):
        raise ValueError(f"{where}: field 'success' must be true, false or absent, got {success!r}")
    return LabelledCandidate(str(data["task_id"]), Candidate(str(data["candidate_id"]), content), success)


def candidates_from_trajectories(trajectories: Iterable[Trajectory]) -> list[LabelledCandidate]:
    """Finished trajectories with model calls as candidates of their tasks, labelled by their outcome."""
    return [
        LabelledCandidate(t.task_id, Candidate.from_trajectory(t), t.success if t.complete else None)
        for t in trajectories
        if t.steps
    ]
