"""The run's curves: per stage, the rolling mean reward and success rate of its training episodes over time; the
held-out results of ``results.json`` as points; each trainer's loss.

Training episodes are the graded ones outside evaluation groups, ordered by when they ended and placed in the stage
running then (``runfiles.stage_at``); the rolling window restarts at each stage, so a stage's curve shows only what
that stage's policy did. A held-out row is drawn at its ``evaluated_at`` time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from orchard.viewer.index import NO_OUTCOME
from orchard.viewer.runfiles import RunFiles, Stage

OUTSIDE_STAGES = ""  # the curve name of training episodes that ended outside every stage


def run_curves(rows: Iterable[Mapping[str, Any]], stages: list[Stage], files: RunFiles, window: int) -> dict[str, Any]:
    """Curves of the summary ``rows`` (``EpisodeRecords.summary``): ``stages``, ``training``, ``heldout``, ``loss``."""
    return {
        "window": window,
        "stages": [stage.public() for stage in stages],
        "training": training_curves(rows, window),
        "heldout": [{**row, "time": _iso_ms(row.get("evaluated_at"))} for row in files.heldout()],
        "loss": files.trainer_loss(),
    }


def training_curves(rows: Iterable[Mapping[str, Any]], window: int) -> dict[str, list[dict[str, Any]]]:
    """Per stage name: one point per training episode, with its reward, success and the rolling means up to it.

    >>> rows = [{"eval": False, "status": "FAILED", "ended_ms": t, "reward": r, "success": r > 0, "stage": "rl",
    ...          "episode_id": f"e{t}"} for t, r in ((1, 0.0), (2, 1.0), (3, 1.0))]
    >>> [(p["time"], p["mean_reward"]) for p in training_curves(rows, 2)["rl"]]
    [(1, 0.0), (2, 0.5), (3, 1.0)]
    """
    graded = [r for r in rows if not r["eval"] and r["status"] != NO_OUTCOME and r["ended_ms"] is not None]
    by_stage: dict[str, list[Mapping[str, Any]]] = {}
    for row in sorted(graded, key=lambda r: r["ended_ms"]):
        by_stage.setdefault(row["stage"] or OUTSIDE_STAGES, []).append(row)
    return {name: _points(stage_rows, window) for name, stage_rows in by_stage.items()}


def _points(rows: list[Mapping[str, Any]], window: int) -> list[dict[str, Any]]:
    rewards = rolling_mean([r["reward"] or 0.0 for r in rows], window)
    successes = rolling_mean([1.0 if r["success"] else 0.0 for r in rows], window)
    return [
        {"time": row["ended_ms"], "episode_id": row["episode_id"], "reward": row["reward"],
         "success": bool(row["success"]), "mean_reward": float(reward), "success_rate": float(success)}
        for row, reward, success in zip(rows, rewards, successes, strict=True)
    ]  # fmt: skip


def rolling_mean(values: list[float], window: int) -> npt.NDArray[np.float64]:
    """The mean of each value and up to ``window - 1`` values before it.

    >>> rolling_mean([1.0, 3.0, 5.0, 7.0], 2).tolist()
    [1.0, 2.0, 4.0, 6.0]
    """
    sums = np.cumsum(np.asarray([0.0, *values], dtype=np.float64))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(ends - window, 0)
    return np.asarray((sums[ends] - sums[starts]) / (ends - starts), dtype=np.float64)


def _iso_ms(text: Any) -> int | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None
