"""Best-of-K picks for held-out evaluation: the reranker chooses among the finished episodes with trajectories;
a task with none to score falls back to its first finished episode."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from orchard.evaluation.heldout import EpisodeResult
from orchard.evaluation.rerank import ValuePicker
from orchard.rerank_candidates import Candidate, RerankResult
from orchard.trajectory import Trajectory
from trainers.rerank import select_best

SCORES = {"a0": 0.2, "a1": 0.9, "a2": 0.5}


class ScoreTable:
    """A reranker whose scores are a table by episode id."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def pick(self, candidates: Sequence[Candidate]) -> RerankResult:
        """The best by the table."""
        ids = [c.candidate_id for c in candidates]
        self.seen.append(ids)
        return select_best(ids, [SCORES[i] for i in ids])


def trajectory(episode_id: str) -> Trajectory:
    """An empty trajectory of ``episode_id``."""
    return Trajectory(run_id="run", episode_id=episode_id, task_id="a", group_id="g", steps=())


def episodes(*finished: bool) -> list[EpisodeResult]:
    """Episodes a0, a1, ... of task a; those not ``finished`` have no outcome."""
    return [EpisodeResult(f"a{i}", "a", i, "SUCCEEDED" if done else "MISSING") for i, done in enumerate(finished)]


def test_the_highest_scored_finished_episode_with_a_trajectory_is_chosen() -> None:
    ranker = ScoreTable()
    fetched: list[set[str]] = []

    def fetch(ids: set[str], deadline: float) -> dict[str, Trajectory]:
        fetched.append(ids)
        return {i: trajectory(i) for i in ids if i != "a2"}

    chosen = ValuePicker(ranker, fetch, wait_s=5)("a", episodes(True, True, True))

    assert chosen.episode_id == "a1"
    assert fetched == [{"a0", "a1", "a2"}]
    assert ranker.seen == [["a0", "a1"]]


def test_unfinished_episodes_are_never_chosen_and_nothing_to_score_falls_back_to_the_first_finished() -> None:
    picker = ValuePicker(ScoreTable(), lambda ids, deadline: {}, wait_s=0)

    assert picker("a", episodes(False, True, True)).episode_id == "a1"
    assert picker("a", episodes(False, False)).episode_id == "a0"
    assert picker.fallbacks == 1


class Scores:
    """A reranker with fixed scores by episode id."""

    def __init__(self, scores: dict[str, float]) -> None:
        self.scores = scores

    def pick(self, candidates: Sequence[Candidate]) -> RerankResult:
        """The best by the scores."""
        ids = [c.candidate_id for c in candidates]
        return select_best(ids, [self.scores[i] for i in ids])


def all_fetched(ids: set[str], deadline: float) -> dict[str, Trajectory]:
    """Every episode has a trajectory."""
    return {i: trajectory(i) for i in ids}


def test_a_near_tie_keeps_the_greedy_first_episode_where_a_plain_argmax_takes_a_sampled_one() -> None:
    # The file-lookup recipe's value model rates plausible episodes 0.985 +- 0.001: the argmax picked failing samples.
    near_tie = Scores({"a0": 0.9840, "a1": 0.9852, "a2": 0.9849})

    assert ValuePicker(near_tie, all_fetched, wait_s=5)("a", episodes(True, True, True)).episode_id == "a1"
    picker = ValuePicker(near_tie, all_fetched, wait_s=5, keep_first_within=0.1)
    assert picker("a", episodes(True, True, True)).episode_id == "a0"
    assert (picker.kept_first, picker.overrides) == (1, 0)


def test_the_value_model_replaces_a_greedy_episode_it_rates_clearly_lower() -> None:
    picker = ValuePicker(Scores({"a0": 0.02, "a1": 0.98, "a2": 0.97}), all_fetched, wait_s=5, keep_first_within=0.1)

    assert picker("a", episodes(True, True, True)).episode_id == "a1"
    assert (picker.kept_first, picker.overrides) == (0, 1)


def test_without_the_greedy_episode_finished_the_margin_does_not_favour_another() -> None:
    picker = ValuePicker(Scores({"a0": 0.9, "a1": 0.50, "a2": 0.55}), all_fetched, wait_s=5, keep_first_within=0.1)

    assert picker("a", episodes(False, True, True)).episode_id == "a2"


def test_a_margin_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="keep_first_within"):
        ValuePicker(Scores({}), all_fetched, keep_first_within=1.5)
