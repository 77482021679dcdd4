"""The reward curve of a run: rolling mean reward and rolling success rate over its episodes, coloured by policy
version, drawn from the run's ``outcomes`` topic into ``RUN_DIR/reward_curve.png``.

Episodes are ordered by when they ended. Evaluation episodes (group ids from ``orchard.evaluation.heldout``) are left
out by default: the curve shows what the policy learned from, the results table what it achieved on held-out tasks.
Drawing uses matplotlib's Agg canvas directly (no pyplot, no global backend switch), so it works headless and from
any thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from orchard.bus import Bus, read_until_quiet
from orchard.codec import Codec
from orchard.evaluation.exceptions import PlotError
from orchard.evaluation.heldout import is_eval_group
from orchard.logging import get_logger
from orchard.serialization_errors import SerializationError
from orchard.topics import OUTCOMES

log = get_logger("orchard.evaluation.plot")

REWARD_CURVE_PNG = "reward_curve.png"


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """One episode on the curve."""

    ended_at: int
    reward: float
    success: bool
    policy_version: int | None


def read_outcomes(
    bus: Bus, run_id: str | None = None, *, topic: str = OUTCOMES, include_eval: bool = False, max_idle_polls: int = 2
) -> list[CurvePoint]:
    """The run's outcomes (every run's when ``run_id`` is None), ordered by end time; stops once the topic is quiet."""
    codec = Codec.default()
    points: list[CurvePoint] = []
    with bus.consumer([topic], group=None, start="earliest") as consumer:
        for record in read_until_quiet(consumer, max_records=500, poll_timeout_s=0.5, idle_polls=max_idle_polls):
            try:
                decoded = codec.decode(record.value)
            except SerializationError:
                continue
            if decoded.name == "EpisodeOutcome" and _wanted(decoded.record, run_id, include_eval):
                points.append(_point(decoded.record))
    return sorted(points, key=lambda point: point.ended_at)


def _wanted(outcome: Mapping[str, Any], run_id: str | None, include_eval: bool) -> bool:
    return (run_id is None or outcome["run_id"] == run_id) and (include_eval or not is_eval_group(outcome["group_id"]))


def _point(outcome: Mapping[str, Any]) -> CurvePoint:
    ended = outcome["ended_at"]
    ended_ms = int(ended.timestamp() * 1000) if hasattr(ended, "timestamp") else int(ended)
    version = outcome.get("policy_version")
    return CurvePoint(
        ended_ms, float(outcome["reward"]), bool(outcome["success"]), None if version is None else int(version)
    )


def rolling_mean(values: Sequence[float], window: int) -> npt.NDArray[np.float64]:
    """The mean of each value and up to ``window - 1`` values before it (shorter at the start).

    >>> rolling_mean([1.0, 3.0, 5.0, 7.0], 2).tolist()
    [1.0, 2.0, 4.0, 6.0]
    """
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    data = np.asarray(values, dtype=np.float64)
    sums = np.cumsum(np.concatenate([[0.0], data]))
    ends = np.arange(1, len(data) + 1)
    starts = np.maximum(0, ends - window)
    return np.asarray((sums[ends] - sums[starts]) / (ends - starts), dtype=np.float64)


def plot_reward_curve(points: Sequence[CurvePoint], path: Path, *, window: int = 50, title: str = "") -> Path:
    """Draw the curve of ``points`` into the PNG ``path``; returns it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not points:
        raise PlotError("no outcomes to plot: the run has no finished training episodes yet")
    window = max(1, min(window, len(points)))
    x = np.arange(1, len(points) + 1)
    versions = [point.policy_version for point in points]
    figure = Figure(figsize=(8, 6), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    reward_axes, success_axes = figure.subplots(2, 1, sharex=True)
    series = (
        (reward_axes, rolling_mean([p.reward for p in points], window), "mean reward"),
        (success_axes, rolling_mean([float(p.success) for p in points], window), "success rate"),
    )
    for axes, values, label in series:
        scatter = _draw(axes, x, values, versions)
        axes.set_ylabel(f"{label} (rolling {window})")
        axes.grid(alpha=0.3)
    success_axes.set_ylim(-0.02, 1.02)
    success_axes.set_xlabel("episode (by end time)")
    if scatter is not None:
        figure.colorbar(scatter, ax=[reward_axes, success_axes], label="policy version")
    figure.suptitle(title or f"{len(points)} episodes")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    log.info("reward curve written", path=str(path), episodes=len(points))
    return path


def _draw(axes: Any, x: npt.NDArray[np.int64], values: npt.NDArray[np.float64], versions: Sequence[int | None]) -> Any:
    """A grey line through every point, the points coloured by policy version where known."""
    axes.plot(x, values, color="0.6", linewidth=1.0)
    known = np.array([version is not None for version in versions])
    if not known.any():
        return None
    colours = np.array([version for version in versions if version is not None], dtype=np.float64)
    return axes.scatter(x[known], values[known], c=colours, cmap="viridis", s=8, zorder=3)


def write_reward_curve(
    bus: Bus, run_dir: Path, run_id: str | None = None, *, topic: str = OUTCOMES, window: int = 50
) -> Path:
    """Read the run's outcomes from the bus and write ``RUN_DIR/reward_curve.png``."""
    points = read_outcomes(bus, run_id, topic=topic)
    return plot_reward_curve(points, run_dir / REWARD_CURVE_PNG, window=window, title=f"run {run_id or 'all'}")
