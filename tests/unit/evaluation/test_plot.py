"""The reward curve: drawn from synthetic outcomes on the embedded bus into a PNG; evaluation episodes left out."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchard.bus import Bus
from orchard.evaluation.exceptions import PlotError
from orchard.evaluation.plot import (
    REWARD_CURVE_PNG,
    CurvePoint,
    plot_reward_curve,
    read_outcomes,
    rolling_mean,
    write_reward_curve,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def training_outcomes(outcome: Callable[..., dict[str, Any]], count: int = 60) -> list[dict[str, Any]]:
    """Episodes that get better with each policy version (one version per 20 episodes)."""
    return [
        outcome(
            f"e{i}",
            success=i % 3 != 0 or i > 40,
            reward=min(1.0, i / count + 0.2),
            policy_version=i // 20,
            ended_at=1_700_000_000_000 + i * 1000,
        )  # fmt: skip
        for i in range(count)
    ]


def test_reward_curve_png_is_written_from_the_runs_outcomes(
    bus: Bus, publish: Callable[..., None], outcome: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    publish(training_outcomes(outcome))

    path = write_reward_curve(bus, tmp_path / "run", "run", window=10)

    assert path == tmp_path / "run" / REWARD_CURVE_PNG
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 1000


def test_outcomes_are_read_for_one_run_in_end_time_order_without_eval_episodes(
    bus: Bus, publish: Callable[..., None], outcome: Callable[..., dict[str, Any]]
) -> None:
    publish([
        outcome("late", reward=0.9, ended_at=3000, policy_version=2),
        outcome("early", reward=0.1, ended_at=1000),
        outcome("held-out", reward=1.0, ended_at=2000, group_id="eval-sft-t"),
        outcome("other-run", run_id="other", ended_at=1500),
    ])  # fmt: skip

    assert read_outcomes(bus, "run") == [CurvePoint(1000, 0.1, False, None), CurvePoint(3000, 0.9, False, 2)]
    assert [p.ended_at for p in read_outcomes(bus, None)] == [1000, 1500, 3000]


def test_a_curve_without_policy_versions_is_drawn_too(tmp_path: Path) -> None:
    points = [CurvePoint(i, i / 10, i % 2 == 0, None) for i in range(10)]

    data = plot_reward_curve(points, tmp_path / "curve.png", window=3).read_bytes()

    assert data[:8] == PNG_SIGNATURE


def test_no_outcomes_is_a_clear_error(bus: Bus, tmp_path: Path) -> None:
    bus.create_topic("outcomes", exist_ok=True)

    with pytest.raises(PlotError, match="no outcomes to plot"):
        write_reward_curve(bus, tmp_path, "run")
    assert not (tmp_path / REWARD_CURVE_PNG).exists()


def test_rolling_mean_averages_the_last_window_values() -> None:
    assert rolling_mean([0.0, 1.0, 1.0, 0.0, 1.0], 3).tolist() == [0.0, 0.5, 2 / 3, 2 / 3, 2 / 3]
    with pytest.raises(ValueError, match="window"):
        rolling_mean([1.0], 0)
