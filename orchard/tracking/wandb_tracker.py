"""A Weights & Biases run (the ``tracking`` extra), offline by default: ``wandb sync RUN_DIR/tracking/wandb/offline-*``
uploads it later.

W&B keeps one step counter per run that may only grow, while a run's figures come in several step spaces (each
trainer's optimizer step, the policy version, the position of an evaluated stage). So every namespace (a name up to
its last ``/``: ``trainer/policy``, ``eval``, ``outcomes``) gets its own step metric, ``<namespace>/step``, declared
with ``define_metric``; points are logged without W&B's own ``step``, so none is ever dropped as out of order. A
point's tags (stage, policy version) are logged beside its values as ``<namespace>/<tag>``, unless a value
has that name already (a trainer's ``policy_version`` stays a number).

The W&B run id is derived from Orchard's run id and directory, and opened with ``resume="allow"``: a restarted
follower continues the same run (offline, each process writes its own ``offline-run-*`` folder with that id).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from pathlib import Path
from typing import Any

from orchard.tracking.base import Scalars, Table, Tracker
from orchard.tracking.config import WandbTrackerConfig
from orchard.tracking.exceptions import TrackerUnavailableError, TrackingError


class WandbTracker(Tracker):
    """Logs to one W&B run named after Orchard's run."""

    def __init__(self, config: WandbTrackerConfig, root: Path, run_id: str, run_dir: Path) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise TrackerUnavailableError("the wandb tracker needs wandb: pip install 'orchard-rl[tracking]'") from exc
        root.mkdir(parents=True, exist_ok=True)
        self._wandb: Any = wandb
        self._declared: set[str] = set()
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, disable_git=True)
        try:
            self._run: Any = wandb.init(
                project=config.project, entity=config.entity, name=run_id, id=wandb_run_id(run_id, run_dir),
                resume="allow", mode=config.mode, dir=str(root), settings=settings,
                config={"run_id": run_id, "run_dir": str(run_dir)},
            )  # fmt: skip
        except Exception as exc:  # wandb raises its own errors (no key online, a bad entity, ...)
            raise TrackingError(f"cannot open the W&B run of {run_id}: {exc}") from exc

    def log_scalars(self, scalars: Scalars) -> None:
        rows: dict[str, dict[str, Any]] = defaultdict(dict)
        for name, value in scalars.values.items():
            rows[namespace(name)][name] = float(value)
        for space, row in rows.items():
            row |= {key: text for tag, text in scalars.tags.items() if (key := f"{space}/{tag}") not in row}
            self._log(space, row, scalars.step)

    def log_table(self, table: Table) -> None:
        data = [list(row) for row in table.rows]
        self._log(namespace(table.name), {table.name: self._wandb.Table(columns=list(table.columns), data=data)},
                  table.step)  # fmt: skip

    def flush(self) -> None:
        """Nothing to do: wandb hands each row to its service process as it is logged."""

    def close(self) -> None:
        self._run.finish()

    def _log(self, space: str, row: dict[str, Any], step: int) -> None:
        if space not in self._declared:
            self._run.define_metric(f"{space}/step", hidden=True)
            self._run.define_metric(f"{space}/*", step_metric=f"{space}/step")
            self._declared.add(space)
        self._run.log({**row, f"{space}/step": step})


def namespace(name: str) -> str:
    """The part of ``name`` before its last ``/`` (``""`` for a bare name).

    >>> namespace("trainer/policy/loss"), namespace("loss")
    ('trainer/policy', '')
    """
    return name.rpartition("/")[0]


def wandb_run_id(run_id: str, run_dir: Path) -> str:
    """A W&B run id (lower-case hex) fixed by Orchard's run id and the run directory."""
    return hashlib.blake2b(f"{run_id}\0{run_dir.resolve()}".encode(), digest_size=8).hexdigest()
