"""What the viewer reads from the run directory itself: stages (``state.json``), held-out rows (``results.json``),
trainer loss (each trainer's ``metrics.jsonl``) and the recipe's starting model (``recipe.yaml``).

Every reader tolerates a file that is absent or half written (the run may still be going): it returns what it can
read and logs what it cannot, so one bad file never takes the page down.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from orchard.evaluation.exceptions import ResultsError
from orchard.evaluation.results import read_rows
from orchard.exceptions import ConfigError
from orchard.logging import get_logger
from orchard.run.rundir import RunDir

log = get_logger("orchard.viewer.runfiles")

MAX_LOSS_POINTS = 2000  # per trainer; longer histories are thinned evenly (the last step always kept)


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage of the run, its times in milliseconds since the epoch (None: not started / not ended)."""

    name: str
    description: str
    status: str
    started_ms: int | None
    ended_ms: int | None

    def contains(self, when_ms: int) -> bool:
        """Whether ``when_ms`` falls between the stage's first start and its end (open while it runs)."""
        if self.started_ms is None or when_ms < self.started_ms:
            return False
        return self.ended_ms is None or when_ms <= self.ended_ms

    def public(self) -> dict[str, Any]:
        """The stage as the API sends it."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RunFiles:
    """The files of one run directory the viewer shows."""

    root: Path

    def stages(self) -> list[Stage]:
        """The stages in recipe order ([] before the run wrote ``state.json``)."""
        try:
            state = RunDir(self.root).read_state()
        except ConfigError as exc:
            log.warning("state unreadable", error=str(exc))
            return []
        return [_stage(entry) for entry in state.get("stages") or [] if isinstance(entry, dict) and "name" in entry]

    def heldout(self) -> list[dict[str, Any]]:
        """The rows of ``results.json`` (held-out evaluation per stage), as JSON objects."""
        try:
            return [asdict(row) for row in read_rows(self.root)]
        except ResultsError as exc:
            log.warning("results unreadable", error=str(exc))
            return []

    def trainer_loss(self) -> dict[str, list[dict[str, float]]]:
        """Per trainer directory (``RUN_DIR/<name>/metrics.jsonl``): its steps' ``time`` (ms), ``step`` and ``loss``."""
        return {path.parent.name: _loss_points(path) for path in sorted(self.root.glob("*/metrics.jsonl"))}

    def recipe_model(self) -> str | None:
        """The recipe's starting model (``model:`` of ``recipe.yaml``), None when there is no recipe or no model."""
        try:
            recipe = yaml.safe_load((self.root / "recipe.yaml").read_text())
        except (OSError, yaml.YAMLError):
            return None
        model = recipe.get("model") if isinstance(recipe, dict) else None
        return model if isinstance(model, str) else None


def stage_at(stages: list[Stage], when_ms: int | None) -> str | None:
    """The name of the latest-starting stage whose span holds ``when_ms`` (None: outside every stage).

    >>> stages = [Stage("a", "", "completed", 0, 10), Stage("b", "", "running", 10, None)]
    >>> stage_at(stages, 5), stage_at(stages, 10), stage_at(stages, 99), stage_at(stages, -1)
    ('a', 'b', 'b', None)
    """
    if when_ms is None:
        return None
    started = sorted((s for s in stages if s.started_ms is not None), key=lambda s: s.started_ms or 0)
    candidates = started[: bisect_right([s.started_ms or 0 for s in started], when_ms)]
    return next((s.name for s in reversed(candidates) if s.contains(when_ms)), None)


def _stage(entry: dict[str, Any]) -> Stage:
    return Stage(
        name=str(entry["name"]),
        description=str(entry.get("description") or ""),
        status=str(entry.get("status") or "pending"),
        started_ms=_ms(entry.get("first_started_at") or entry.get("started_at")),
        ended_ms=_ms(entry.get("ended_at")),
    )


def _ms(seconds: Any) -> int | None:
    return int(float(seconds) * 1000) if isinstance(seconds, int | float) else None


def _loss_points(path: Path) -> list[dict[str, float]]:
    points: list[dict[str, float]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        log.warning("metrics unreadable", path=str(path), error=str(exc))
        return []
    for line in lines:
        try:
            row = json.loads(line)
            points.append({"time": float(row["time"]) * 1000, "step": float(row["step"]), "loss": float(row["loss"])})
        except (ValueError, KeyError, TypeError):
            continue  # a line being written, or a step without a loss
    return thinned(points, MAX_LOSS_POINTS)


def thinned(points: list[dict[str, float]], limit: int) -> list[dict[str, float]]:
    """At most ``limit`` of ``points``, evenly spaced, the last one kept.

    >>> [p["step"] for p in thinned([{"step": float(i)} for i in range(10)], 4)]
    [0.0, 3.0, 6.0, 9.0]
    """
    if len(points) <= limit:
        return points
    stride = -(-len(points) // limit)
    kept = points[::stride]
    return kept if kept[-1] is points[-1] else [*kept[: limit - 1], points[-1]]
