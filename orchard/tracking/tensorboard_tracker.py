"""TensorBoard event files through ``tensorboardX`` (the ``tracking`` extra): scalars, and tables as markdown text.

Each scalar keeps its name as the TensorBoard tag and its measuring time as the event's wall time; a table becomes a
text summary (a markdown table) at its step. Tags of a point are not written: TensorBoard has nowhere to keep them,
and the names already say the trainer, stage and namespace.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from orchard.tracking.base import Scalars, Table, Tracker
from orchard.tracking.exceptions import TrackerUnavailableError


class TensorBoardTracker(Tracker):
    """Writes ``events.out.tfevents.*`` files under ``logdir`` (a new file per writer; TensorBoard reads them all)."""

    def __init__(self, logdir: Path) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as exc:
            raise TrackerUnavailableError(
                "the tensorboard tracker needs tensorboardX: pip install 'orchard-rl[tracking]'"
            ) from exc
        logdir.mkdir(parents=True, exist_ok=True)
        self.logdir = logdir
        # tensorboardX names a file by the second and the host only: a writer opened in the same second (a quick
        # rerun) would replace the last one's file, so each gets a suffix of its own, in the order they were opened
        suffix = f".{time.time_ns()}.{os.getpid()}"
        self._writer: Any = SummaryWriter(logdir=str(logdir), flush_secs=30, filename_suffix=suffix)

    def log_scalars(self, scalars: Scalars) -> None:
        for name, value in scalars.values.items():
            self._writer.add_scalar(name, float(value), global_step=scalars.step, walltime=scalars.wall_time)

    def log_table(self, table: Table) -> None:
        self._writer.add_text(table.name, markdown_table(table), global_step=table.step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def markdown_table(table: Table) -> str:
    """``table`` as a markdown table (``|`` in a cell escaped).

    >>> print(markdown_table(Table("t", ["task", "reward"], [["a|b", 1.0]], 0)))
    | task | reward |
    | --- | --- |
    | a\\|b | 1.0 |
    """

    def line(cells: Any) -> str:
        return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(table.columns), line(["---"] * len(table.columns)), *(line(row) for row in table.rows)])
