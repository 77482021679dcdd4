"""Held-out evaluation with an injected submit function standing in for Orchard Env: ids and groups per stage,
outcomes matched by episode id, missing episodes counted as failures, pass@K and best-of-K picks, labels and
breakdowns, cost, idempotent resubmission."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from orchard.bus import Bus
from orchard.episode_requests import EpisodeRequest
from orchard.evaluation.heldout import (
    EpisodeResult,
    HeldoutConfig,
    eval_episode_id,
    eval_group_id,
    evaluate_heldout,
    first_candidate,
    first_success,
    is_eval_group,
    plan_episodes,
)
from orchard.evaluation.stats import success_stats, wilson_interval

Outcome = Callable[..., dict[str, Any]]


def config(**overrides: Any) -> HeldoutConfig:
    """A quick config: run ``run``, stage ``sft``, 2 s to wait."""
    return HeldoutConfig(**({"run_id": "run", "stage": "sft", "harness": "builtin", "model": "m", "timeout_s": 2.0}
                            | overrides))  # fmt: skip


def fake_env(
    publish: Callable[[list[dict[str, Any]]], None], outcome: Outcome, results: dict[str, tuple[bool, float]]
) -> tuple[list[EpisodeRequest], Callable[[EpisodeRequest], None]]:
    """A submit function that publishes each episode's outcome at once; tasks absent from ``results`` never end."""
    submitted: list[EpisodeRequest] = []

    def submit(request: EpisodeRequest) -> None:
        submitted.append(request)
        if request.task_id in results:
            success, reward = results[request.task_id]
            publish([outcome(request.episode_id, task_id=request.task_id, group_id=request.group_id,
                             success=success, reward=reward, policy_version=4)])  # fmt: skip

    return submitted, submit


def test_plan_gives_each_task_k_deterministic_episodes_in_an_eval_group() -> None:
    requests = plan_episodes(config(samples_per_task=2), ["a", "b"])

    assert [(r.task_id, r.group_id) for r in requests] == [
        ("a", "eval-sft-a"), ("a", "eval-sft-a"), ("b", "eval-sft-b"), ("b", "eval-sft-b"),
    ]  # fmt: skip
    assert [r.episode_id for r in requests] == [eval_episode_id("run", "sft", t, i) for t in "ab" for i in range(2)]
    assert len({r.episode_id for r in requests}) == 4
    assert eval_episode_id("run", "rl", "a", 0) != eval_episode_id("run", "sft", "a", 0)
    assert all(is_eval_group(r.group_id) for r in requests)
    assert not is_eval_group("r000001-a")
    assert eval_group_id("rl", "x") == "eval-rl-x"


def test_greedy_first_makes_each_tasks_first_candidate_greedy_and_leaves_the_others_sampled() -> None:
    options = {"harness": {"temperature": 1.0, "max_tokens": 64}, "task": {"x": 1}}
    requests = plan_episodes(config(samples_per_task=3, options=options, greedy_first=True), ["a", "b"])

    temperatures = [(r.task_id, r.options["harness"]["temperature"]) for r in requests]
    assert temperatures == [("a", 0.0), ("a", 1.0), ("a", 1.0), ("b", 0.0), ("b", 1.0), ("b", 1.0)]
    assert all(r.options["harness"]["max_tokens"] == 64 and r.options["task"] == {"x": 1} for r in requests)
    assert options["harness"]["temperature"] == 1.0  # the config's own options are not changed
    plain = plan_episodes(config(samples_per_task=2, options=options), ["a"])
    assert [r.options["harness"]["temperature"] for r in plain] == [1.0, 1.0]


def test_empty_or_repeated_task_lists_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one task"):
        plan_episodes(config(), [])
    with pytest.raises(ValueError, match="unique"):
        plan_episodes(config(), ["a", "a"])


def test_outcomes_are_matched_by_episode_id_and_a_task_that_never_ends_is_a_reported_failure(
    bus: Bus, publish: Callable[..., None], outcome: Outcome
) -> None:
    # noise: another run's outcome for the same episode id, and an unrelated episode
    first_id = eval_episode_id("run", "sft", "a", 0)
    publish([outcome(first_id, run_id="other", success=False), outcome("unrelated", success=True)])
    submitted, submit = fake_env(publish, outcome, {"a": (True, 1.0), "b": (False, 0.5), "c": (True, 1.0)})

    result = evaluate_heldout(bus, config(timeout_s=1.5), ["a", "b", "c", "d"], submit)

    assert [r.task_id for r in submitted] == ["a", "b", "c", "d"]
    assert [(t.task_id, t.chosen.status, t.chosen.success, t.chosen.reward) for t in result.tasks] == [
        ("a", "SUCCEEDED", True, 1.0), ("b", "FAILED", False, 0.5), ("c", "SUCCEEDED", True, 1.0),
        ("d", "MISSING", False, 0.0),
    ]  # fmt: skip
    assert result.success == success_stats(2, 4)
    assert result.reward.mean == pytest.approx(0.625)
    assert result.missing == [eval_episode_id("run", "sft", "d", 0)]
    assert result.tasks[0].chosen.policy_version == 4
    assert result.wall_time_s >= 1.5


def test_with_k_samples_the_picker_chooses_and_pass_at_k_and_mean_success_are_reported(
    bus: Bus, publish: Callable[..., None], outcome: Outcome
) -> None:
    wins = {eval_episode_id("run", "sft", "a", 1), eval_episode_id("run", "sft", "b", 2)}

    def submit(request: EpisodeRequest) -> None:
        won = request.episode_id in wins
        publish([outcome(request.episode_id, task_id=request.task_id, success=won, reward=float(won))])

    def last(task_id: str, candidates: Sequence[EpisodeResult]) -> EpisodeResult:
        return candidates[-1]

    first = evaluate_heldout(bus, config(samples_per_task=3), ["a", "b"], submit)
    picked = evaluate_heldout(
        bus, config(samples_per_task=3, selection="rerank"), ["a", "b"], lambda request: None, picker=last
    )

    assert [t.chosen.index for t in first.tasks] == [0, 0]
    assert (first.success.successes, first.any_success, first.mean_success) == (0, 1.0, pytest.approx(2 / 6))
    assert [t.chosen.index for t in picked.tasks] == [2, 2]
    assert picked.success.successes == 1  # b's third sample won; a's did not
    assert picked.missing == []  # a resubmission that Env ignores reads the outcomes already on the bus
    assert (first.selection, picked.selection) == ("first", "rerank@3")


def test_pass_at_k_counts_a_task_solved_when_any_attempt_succeeds_and_reports_pass_at_1_beside_it(
    bus: Bus, publish: Callable[..., None], outcome: Outcome
) -> None:
    wins = {eval_episode_id("run", "sft", "a", 1), eval_episode_id("run", "sft", "b", 0)}

    def submit(request: EpisodeRequest) -> None:
        won = request.episode_id in wins
        publish([outcome(request.episode_id, task_id=request.task_id, success=won, reward=float(won))])

    result = evaluate_heldout(bus, config(samples_per_task=2, selection="pass"), ["a", "b", "c"], submit)

    assert [(t.task_id, t.chosen.index, t.chosen.success) for t in result.tasks] == [
        ("a", 1, True), ("b", 0, True), ("c", 0, False),
    ]  # fmt: skip
    assert result.success == success_stats(2, 3)
    assert (result.selection, result.any_success, result.mean_success) == ("pass@2", 2 / 3, 2 / 6)
    assert result.to_json()["summary"]["pass_at_1"] == 2 / 6


def test_the_picker_must_fit_the_selection(bus: Bus) -> None:
    with pytest.raises(ValueError, match="needs a picker"):
        evaluate_heldout(bus, config(samples_per_task=2, selection="rerank"), ["a"], lambda request: None)
    with pytest.raises(ValueError, match="only used with selection 'rerank', not 'pass'"):
        evaluate_heldout(
            bus, config(samples_per_task=2, selection="pass"), ["a"], lambda request: None, picker=first_candidate
        )


def test_labels_come_along_and_results_are_broken_down_by_the_configured_labels(
    bus: Bus, publish: Callable[..., None], outcome: Outcome
) -> None:
    _, submit = fake_env(publish, outcome, {"a": (True, 1.0), "b": (False, 0.0), "c": (True, 1.0)})
    labels = {"a": {"repo": "x"}, "b": {"repo": "x"}, "c": {"repo": "y", "bug_kind": "logic"}}

    result = evaluate_heldout(bus, config(by=["repo", "bug_kind"]), ["a", "b", "c"], submit, labels=labels)

    assert [t.labels for t in result.tasks] == [{"repo": "x"}, {"repo": "x"}, {"repo": "y", "bug_kind": "logic"}]
    assert {label: [(g.value, g.success.successes, g.success.n) for g in groups]
            for label, groups in result.breakdowns.items()} == {
        "repo": [("x", 1, 2), ("y", 1, 1)], "bug_kind": [("logic", 1, 1), ("(none)", 1, 2)],
    }  # fmt: skip
    assert result.to_json()["breakdown"]["repo"][1] == {
        "value": "y", "tasks": 1, "successes": 1, "success_rate": 1.0, "success_ci": list(wilson_interval(1, 1)),
        "attempts": 1, "pass_at_1": 1.0,
    }  # fmt: skip


def test_cost_sums_calls_and_episode_times_of_finished_episodes_and_tokens_stay_zero_without_calls_on_the_bus(
    bus: Bus, publish: Callable[..., None], outcome: Outcome
) -> None:
    _, submit = fake_env(publish, outcome, {"a": (True, 1.0), "b": (False, 0.0)})

    result = evaluate_heldout(bus, config(timeout_s=0.5), ["a", "b", "c"], submit)

    cost = result.cost
    assert cost is not None
    assert (cost.model_calls, cost.episode_time_s, cost.timed_episodes, cost.mean_episode_time_s) == (6, 2.0, 2, 1.0)
    assert (cost.calls_read, cost.prompt_tokens, cost.completion_tokens, cost.tokens_complete) == (0, 0, 0, False)
    assert cost.wall_time_s == result.wall_time_s
    assert evaluate_heldout(bus, config(count_tokens=False), ["a"], submit).cost.calls_read is None  # type: ignore[union-attr]


def test_per_task_detail_is_json_ready(bus: Bus, publish: Callable[..., None], outcome: Outcome) -> None:
    _, submit = fake_env(publish, outcome, {"a": (True, 1.0)})

    detail = evaluate_heldout(bus, config(), ["a"], submit).to_json()

    assert detail["tasks"] == [{
        "task_id": "a",
        "labels": {},
        "chosen": eval_episode_id("run", "sft", "a", 0),
        "episodes": [{"episode_id": eval_episode_id("run", "sft", "a", 0), "index": 0, "status": "SUCCEEDED",
                      "success": True, "reward": 1.0, "policy_version": 4, "error": None, "num_model_calls": 3,
                      "started_at_ms": 1_699_999_999_000, "ended_at_ms": 1_700_000_000_000}],
    }]  # fmt: skip
    assert (detail["selection"], detail["summary"]["successes"], detail["cost"]["model_calls"]) == ("first", 1, 3)
    assert json.loads(json.dumps(detail)) == detail


def test_pass_at_k_picker_takes_the_first_successful_attempt_else_the_first() -> None:
    def attempts(*wins: bool) -> list[EpisodeResult]:
        return [EpisodeResult(f"e{i}", "t", i, "SUCCEEDED" if won else "FAILED", won, float(won))
                for i, won in enumerate(wins)]  # fmt: skip

    assert first_success("t", attempts(False, True, True)).index == 1
    assert first_success("t", attempts(True, False)).index == 0
    assert first_success("t", attempts(False, False)).index == 0
    assert first_success("t", [EpisodeResult("e0", "t", 0), *attempts(False, True)[1:]]).index == 1
