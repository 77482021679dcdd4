"""What a follower has already sent to its tracker, kept in ``RUN_DIR/tracking/<tracker>.state.json``.

The state is written only after the tracker flushed what it stands for (a crash in between sends that pass again; it
never loses one). One file per tracker, so a tracker added later replays the whole run without duplicating the
points of the others.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchard.tracking.exceptions import TrackingError
from orchard.tracking.outcomes import VersionTally

FORMAT_VERSION = 1


@dataclass
class FollowState:
    """Offsets read and figures sent; see the module docstring."""

    metrics: dict[str, int] = field(default_factory=dict)  # metrics.jsonl path relative to RUN_DIR -> byte offset
    results: dict[str, str] = field(default_factory=dict)  # stage -> ``evaluated_at`` of the row sent
    outcome_offsets: dict[str, int] = field(default_factory=dict)  # partition -> next offset
    open_version: int | None = None  # the newest policy version seen; every older one is closed and sent
    open_tally: VersionTally = field(default_factory=VersionTally)
    open_sent: bool = False  # the open version was sent too (the run was over)
    late_episodes: int = 0

    @classmethod
    def load(cls, path: Path) -> FollowState:
        """The state in ``path`` (a fresh one when there is none)."""
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            raise TrackingError(f"cannot read tracking state {path}: {exc}") from exc
        if data.pop("format_version", None) != FORMAT_VERSION:
            raise TrackingError(f"tracking state {path} has an unknown format; remove it to send the run again")
        try:
            return cls(**(data | {"open_tally": VersionTally(**data.get("open_tally", {}))}))
        except TypeError as exc:
            raise TrackingError(f"tracking state {path} is malformed: {exc}") from exc

    def save(self, path: Path) -> None:
        """Replace ``path`` atomically."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"format_version": FORMAT_VERSION, **asdict(self)}, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
