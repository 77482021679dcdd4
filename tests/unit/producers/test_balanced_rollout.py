"""Balanced Adaptive Rollout: estimates, the allocation rule, and its effect in a simulation."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from producers.rollout.balanced import BalancedRollout, BalancedRolloutConfig, expected_mixed_probability
from producers.rollout.simulate import UniformAllocation, simulate

RATES = {"never": 0.0, "coin": 0.5, "always": 1.0}


def policy(**settings: object) -> BalancedRollout:
    return BalancedRollout(BalancedRolloutConfig(**settings))  # type: ignore[arg-type]


def test_expected_mixed_probability_is_exact_for_a_sharp_posterior_and_n_minus_1_over_n_plus_1_for_none() -> None:
    sharp = 1e7  # Beta(0.3 * sharp, 0.7 * sharp) is all but a point mass at p = 0.3
    assert expected_mixed_probability(0.3 * sharp, 0.7 * sharp, 5) == pytest.approx(1 - 0.3**5 - 0.7**5, abs=1e-6)
    assert [round(expected_mixed_probability(1.0, 1.0, n), 6) for n in (1, 2, 3, 8)] == [0.0, 0.333333, 0.5, 0.777778]


def test_expected_mixed_probability_matches_a_monte_carlo_average_over_the_posterior() -> None:
    draws = np.random.default_rng(0).beta(3.0, 5.0, size=200_000)
    monte_carlo = float(np.mean(1 - draws**4 - (1 - draws) ** 4))

    assert expected_mixed_probability(3.0, 5.0, 4) == pytest.approx(monte_carlo, abs=3e-3)


def test_in_a_simulation_the_mixed_task_gets_most_rollouts_and_decided_tasks_keep_the_floor() -> None:
    balanced = policy(budget=24, min_rollouts=2, max_rollouts=32)

    result = simulate(RATES, balanced, rounds=20, seed=0)

    for allocation in result.allocations[5:]:
        assert allocation == {"always": 2, "coin": 20, "never": 2}
    assert balanced.estimate("never").success_rate < 0.05
    assert balanced.estimate("always").success_rate > 0.95


def test_balanced_allocation_yields_more_learning_signal_than_uniform_with_the_same_seed() -> None:
    balanced = simulate(RATES, policy(budget=24), rounds=20, seed=0)
    uniform = simulate(RATES, UniformAllocation(budget=24), rounds=20, seed=0)

    assert balanced.rollouts == uniform.rollouts == 480
    assert balanced.signal_rollouts >= 2 * uniform.signal_rollouts
    assert balanced.mixed_groups >= uniform.mixed_groups


def test_with_many_tasks_of_sparse_success_balanced_allocation_doubles_the_signal() -> None:
    choices = np.random.default_rng(1).choice([0.0, 0.0, 0.0, 0.0, 0.05, 0.2, 0.5, 0.8, 1.0, 1.0], size=30)
    rates = {f"task-{i:02d}": float(rate) for i, rate in enumerate(choices)}

    balanced = simulate(rates, policy(budget=120, max_rollouts=16), rounds=30, seed=0)
    uniform = simulate(rates, UniformAllocation(budget=120), rounds=30, seed=0)

    assert balanced.rollouts == uniform.rollouts
    assert balanced.signal_fraction > 2 * uniform.signal_fraction


def test_an_allocation_spends_the_budget_within_floor_and_cap() -> None:
    rollout = policy(budget=40, min_rollouts=3, max_rollouts=12)
    for _ in range(10):
        rollout.observe("a", True)
        rollout.observe("b", False)
        rollout.observe("c", True)
        rollout.observe("c", False)

    allocation = rollout.allocate(["a", "b", "c", "d"])

    assert sum(allocation.values()) == 40
    assert all(3 <= count <= 12 for count in allocation.values())
    assert allocation["c"] == allocation["d"] == 12  # mixed and unseen tasks are worth the most


def test_the_budget_is_left_unspent_only_when_every_task_is_at_the_cap() -> None:
    assert policy(budget=100, max_rollouts=8).allocate(["a", "b"]) == {"a": 8, "b": 8}


def test_when_floors_do_not_fit_the_unseen_and_uncertain_tasks_get_them_first() -> None:
    rollout = policy(budget=4, min_rollouts=2)
    for _ in range(20):
        rollout.observe("solved", True)

    assert rollout.allocate(["solved", "new-b", "new-a"]) == {"new-a": 2, "new-b": 2, "solved": 0}


def test_allocation_is_a_pure_function_of_the_estimates_with_ties_to_the_smaller_task_id() -> None:
    first = policy(budget=21).allocate(["b", "a", "c"])
    again = policy(budget=21).allocate(["c", "b", "a"])

    assert first == again
    assert first["a"] >= first["b"] >= first["c"]


def test_old_evidence_is_forgotten_so_the_estimate_follows_an_improving_policy() -> None:
    forgetful, remembering = policy(memory=10), policy(memory=None)
    for rollout in (forgetful, remembering):
        for _ in range(100):
            rollout.observe("t", False)
        for _ in range(10):
            rollout.observe("t", True)

    assert forgetful.estimate("t").success_rate > 0.6
    assert remembering.estimate("t").success_rate < 0.15
    assert forgetful.estimate("t").alpha + forgetful.estimate("t").beta < 13  # evidence capped near `memory`


def test_cancelled_outcomes_are_no_evidence() -> None:
    rollout = policy()

    assert rollout.observe_outcome({"task_id": "t", "success": False, "status": "CANCELLED"}) is False
    assert rollout.observe_outcome({"task_id": "t", "success": False, "status": "TIMED_OUT"}) is True
    assert rollout.estimate("t").outcomes == 1


def test_a_floor_above_the_cap_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match=r"min_rollouts \(5\) must not exceed max_rollouts \(4\)"):
        BalancedRolloutConfig(min_rollouts=5, max_rollouts=4)


def test_a_task_with_max_task_outcomes_outcomes_gets_no_more_rollouts_so_rounds_reach_untried_tasks() -> None:
    tasks = [f"t{index}" for index in range(6)]
    uncapped, capped = (
        policy(budget=4, min_rollouts=2, max_rollouts=2),
        policy(budget=4, min_rollouts=2, max_rollouts=2, max_task_outcomes=2),
    )
    tried: dict[str, set[str]] = {"uncapped": set(), "capped": set()}
    for _ in range(3):
        for name, rollout in (("uncapped", uncapped), ("capped", capped)):
            allocation = rollout.allocate(tasks)
            assert sum(allocation.values()) == 4 and set(allocation) == set(tasks)
            for task, count in allocation.items():
                for index in range(count):  # every group mixed: BAR's favourite kind of task
                    rollout.observe(task, index == 0)
                tried[name] |= {task} if count else set()

    assert tried["uncapped"] == {"t0", "t1"}  # the mixed tasks keep outbidding the untried ones
    assert tried["capped"] == set(tasks)
    assert capped.allocate(tasks) == dict.fromkeys(tasks, 0)  # every task spent: nothing left to give


def test_with_a_prior_at_the_policys_success_rate_a_task_it_mostly_fails_outbids_one_it_solves_and_unseen_ones() -> (
    None
):
    bar = BalancedRollout(BalancedRolloutConfig(budget=8, min_rollouts=0, max_rollouts=8, prior_successes=8,
                                                prior_failures=2))  # fmt: skip
    for index in range(8):
        bar.observe("mostly-failed", success=index == 0)
        bar.observe("solved", success=True)

    assert bar.allocate(["mostly-failed", "solved", "unseen"]) == {"mostly-failed": 8, "solved": 0, "unseen": 0}
    # under the uniform prior the same evidence ranks the unseen task first: 1 in 8 looks like a settled failure
    uniform = BalancedRollout(BalancedRolloutConfig(budget=8, min_rollouts=0, max_rollouts=8))
    for index in range(8):
        uniform.observe("mostly-failed", success=index == 0)
    assert uniform.allocate(["mostly-failed", "unseen"]) == {"mostly-failed": 0, "unseen": 8}


def test_aiming_at_failing_tasks_sends_the_round_to_the_mixed_task_the_policy_mostly_fails() -> None:
    def settle(aim: str) -> dict[str, int]:
        bar = BalancedRollout(BalancedRolloutConfig(budget=8, min_rollouts=0, max_rollouts=8, aim=aim))  # type: ignore[arg-type]
        for index in range(8):
            bar.observe("a-mostly-solved", success=index >= 2)  # 6 of 8: its greedy answer is likely right already
            bar.observe("b-mostly-failed", success=index < 2)  # 2 of 8: as likely to be mixed, likely wrong greedily
        return bar.allocate(["a-mostly-solved", "b-mostly-failed"])

    assert settle("mixed") == {"a-mostly-solved": 8, "b-mostly-failed": 0}  # a tie in value: the smaller id
    assert settle("failing") == {"a-mostly-solved": 0, "b-mostly-failed": 8}


def test_an_unknown_aim_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="aim"):
        BalancedRolloutConfig(aim="greedy")  # type: ignore[arg-type]
