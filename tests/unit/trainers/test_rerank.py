"""Reranking K candidates of a task with the value model: the better candidate wins, ties are deterministic."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from orchard.engines.tiny import build_tiny_tokenizer
from orchard.rerank_candidates import Candidate
from orchard.trajectory import Step, Trajectory
from trainers.rerank import (
    LabelledCandidate,
    Reranker,
    candidates_from_trajectories,
    read_candidates_jsonl,
    rerank_tasks,
    select_best,
)
from trainers.value import ValueExample, ValueModel, ValueModelConfig, fit

MARKER = "All tests passed."


@pytest.fixture(scope="module")
def trained() -> ValueModel:
    """A micro value model trained to recognise the marker near the end of a sequence."""
    tokenizer = build_tiny_tokenizer()
    marker = np.asarray(tokenizer.encode(MARKER), dtype=np.int64)
    rng = np.random.default_rng(11)
    examples = []
    for index in range(160):
        success = index % 2 == 0
        body = rng.integers(3, 400, size=int(rng.integers(24, 48)))
        middle = marker if success else rng.integers(3, 400, size=marker.size)
        examples.append(ValueExample(np.concatenate([body, middle]).astype(np.int64), float(success)))
    torch.manual_seed(0)
    model = ValueModel.build(ValueModelConfig(model="tiny-llama-micro", max_length=64))
    fit(model, examples, epochs=3, batch_size=16, learning_rate=1e-3, seed=0)
    return model


def sequence(seed: int, with_marker: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    marker = np.asarray(build_tiny_tokenizer().encode(MARKER), dtype=np.int64)
    middle = marker if with_marker else rng.integers(3, 400, size=marker.size)
    return np.concatenate([rng.integers(3, 400, size=30), middle]).astype(np.int64)


def as_trajectory(episode_id: str, tokens: np.ndarray, success: bool) -> Trajectory:
    last = Step(
        call_index=0,
        conversation_id=0,
        policy_version=1,
        prompt_token_ids=tokens[:-5].astype(np.int32),
        completion_token_ids=tokens[-5:].astype(np.int32),
        completion_logprobs=np.zeros(5, dtype=np.float32),
        request_messages=[],
        response_text="",
        response_tool_calls=[],
        finish_reason="stop",
    )
    return Trajectory(run_id="r", episode_id=episode_id, task_id="t1", group_id="g", steps=(last,), success=success)


def test_reranking_picks_the_candidate_that_carries_the_success_pattern(trained: ValueModel) -> None:
    candidates = [Candidate(f"c{i}", sequence(100 + i, with_marker=i == 2)) for i in range(4)]

    result = Reranker(trained).pick(candidates)

    assert (result.best_id, result.best_index) == ("c2", 2)
    assert result.best_score == max(result.scores)


def test_reranking_trajectories_picks_the_successful_episode(trained: ValueModel) -> None:
    trajectories = [as_trajectory(f"ep-{i}", sequence(200 + i, with_marker=i == 1), success=i == 1) for i in range(3)]

    result = Reranker(trained).pick([Candidate.from_trajectory(t) for t in trajectories])

    assert result.best_id == "ep-1"


def test_reranking_text_candidates_uses_the_value_models_tokenizer(trained: ValueModel) -> None:
    tokenizer = build_tiny_tokenizer()
    filler = tokenizer.decode(sequence(300, with_marker=False)[:30].tolist())
    candidates = [Candidate("fails", filler + " FAILED test_empty"), Candidate("passes", filler + " " + MARKER)]

    assert Reranker(trained).pick(candidates).best_id == "passes"


def test_ties_go_to_the_smallest_id_whatever_the_order() -> None:
    untrained = ValueModel.build(ValueModelConfig(model="tiny-llama-micro", max_length=64))  # 0.5 for everything
    candidates = [Candidate(name, np.arange(5, 5 + size)) for name, size in (("b", 9), ("c", 4), ("a", 7))]

    forward = Reranker(untrained).pick(candidates)
    backward = Reranker(untrained).pick(candidates[::-1])

    assert (forward.best_id, forward.best_index) == ("a", 2)
    assert (backward.best_id, backward.best_index) == ("a", 0)


def test_select_best_treats_scores_within_the_tolerance_as_tied() -> None:
    assert select_best(["z", "y"], [0.9000001, 0.9], tie_tolerance=1e-6).best_id == "y"
    assert select_best(["z", "y"], [0.9001, 0.9], tie_tolerance=1e-6).best_id == "z"


def test_duplicate_candidate_ids_are_refused(trained: ValueModel) -> None:
    with pytest.raises(ValueError, match=r"candidate ids must be unique, got \['a', 'a'\]"):
        Reranker(trained).pick([Candidate("a", np.arange(5, 9)), Candidate("a", np.arange(5, 9))])


def test_reranking_k_candidates_per_task_beats_a_random_pick(trained: ValueModel) -> None:
    items = []
    for task in range(6):
        winner = task % 4
        for index in range(4):
            tokens = sequence(1000 + 10 * task + index, with_marker=index == winner)
            candidate = Candidate(f"t{task}-c{index}", tokens)
            items.append(LabelledCandidate(f"task-{task}", candidate, index == winner))

    report = rerank_tasks(Reranker(trained), items, k=4)

    assert sorted(report.picks) == [f"task-{task}" for task in range(6)]
    assert (report.picked_success, report.mean_success, report.oracle_success) == (1.0, 0.25, 1.0)


def test_only_the_first_k_candidates_of_a_task_are_considered(trained: ValueModel) -> None:
    items = [
        LabelledCandidate("t", Candidate(f"c{i}", sequence(400 + i, with_marker=i == 3)), i == 3) for i in range(4)
    ]

    report = rerank_tasks(Reranker(trained), items, k=2)

    assert len(report.picks["t"].scores) == 2
    assert report.oracle_success == 0.0


def test_candidates_read_from_jsonl_name_the_bad_line(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    rows = [
        {"task_id": "t", "candidate_id": "a", "text": "diff --git", "success": True},
        {"task_id": "t", "candidate_id": "b", "token_ids": [5, 6, 7]},
    ]
    good.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task_id": "t", "candidate_id": "a"}) + "\n")

    items = read_candidates_jsonl(good)

    assert [(i.task_id, i.candidate.candidate_id, i.success) for i in items] == [("t", "a", True), ("t", "b", None)]
    assert items[1].candidate.content.tolist() == [5, 6, 7]  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"bad.jsonl:1: a candidate needs 'text'"):
        read_candidates_jsonl(bad)


def test_trajectories_become_candidates_labelled_by_their_outcome() -> None:
    done = as_trajectory("ep-1", sequence(1, with_marker=True), success=True)
    empty = Trajectory(run_id="r", episode_id="ep-2", task_id="t1", group_id="g", steps=())

    items = candidates_from_trajectories([done, empty])

    assert [(i.task_id, i.candidate.candidate_id, i.success) for i in items] == [("t1", "ep-1", True)]
