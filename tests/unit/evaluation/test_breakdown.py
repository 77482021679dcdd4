"""Results broken down by a task label: a Wilson interval and pass@1 per value, tasks without the label grouped
apart; which labels to break down by (``repo`` by default when every task has it; an unknown label is an error)."""

from __future__ import annotations

import pytest

from orchard.evaluation.breakdown import NO_VALUE, breakdown, breakdown_labels
from orchard.evaluation.exceptions import EvaluationError
from orchard.evaluation.heldout import EpisodeResult, TaskResult, first_success
from orchard.evaluation.stats import success_stats


def task(task_id: str, labels: dict[str, str], *wins: bool) -> TaskResult:
    """A task with one attempt per ``wins`` entry, pass@K picked."""
    episodes = [EpisodeResult(f"{task_id}-{i}", task_id, i, "SUCCEEDED" if won else "FAILED", won, float(won))
                for i, won in enumerate(wins)]  # fmt: skip
    return TaskResult(task_id, episodes, first_success(task_id, episodes), labels)


def test_each_label_value_gets_its_success_rate_wilson_interval_and_pass_at_1() -> None:
    tasks = [
        task("a", {"repo": "textstats", "bug_kind": "logic"}, False, True),
        task("b", {"repo": "textstats"}, False, False),
        task("c", {"repo": "csvlite", "bug_kind": "logic"}, True, True),
        task("d", {"repo": "textstats", "bug_kind": "off-by-one"}, True, False),
    ]

    by_repo = breakdown(tasks, "repo")
    by_kind = breakdown(tasks, "bug_kind")

    assert [(g.value, g.success, g.attempts, g.pass_at_1) for g in by_repo] == [
        ("csvlite", success_stats(1, 1), 2, 1.0), ("textstats", success_stats(2, 3), 6, 2 / 6),
    ]  # fmt: skip
    assert [(g.value, g.success.successes, g.success.n) for g in by_kind] == [
        ("logic", 2, 2), ("off-by-one", 1, 1), (NO_VALUE, 0, 1),
    ]  # fmt: skip
    assert [(g.value, g.success) for g in breakdown(tasks, "absent")] == [(NO_VALUE, success_stats(3, 4))]


def test_repo_is_the_default_label_only_when_every_task_has_it() -> None:
    assert breakdown_labels(None, [{"repo": "x"}, {"repo": "y", "split": "eval"}]) == ["repo"]
    assert breakdown_labels([], [{"repo": "x"}, {"split": "eval"}]) == []
    assert breakdown_labels(None, []) == []


def test_requested_labels_are_kept_in_order_once_and_an_unknown_one_is_named() -> None:
    labels = [{"repo": "x", "bug_kind": "logic"}, {"split": "eval"}]

    assert breakdown_labels(["split", "repo", "split"], labels) == ["split", "repo"]
    with pytest.raises(EvaluationError, match=r"--by nope: no task has that label \(labels of these tasks: "
                                              r"bug_kind, repo, split\)"):  # fmt: skip
        breakdown_labels(["repo", "nope"], labels)
