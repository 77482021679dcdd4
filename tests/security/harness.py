"""The adversarial harness: an adapter whose "agent" is an attack script, run in the sandbox as a real harness is.

It never calls the model to solve the task: ``prepare`` writes the toolkit (``kit.py``) and the rendered attack into
its state directory, ``command`` runs the attack (its stdout and stderr are the harness's logs, which the Env could
ship anywhere), and ``collect`` reads the working copy's patch as the built-in adapters do (``git diff`` in the
sandbox), then snapshots what the sandbox holds before grading for the leak checks. The wrapper always exits 0 so
the episode is graded (a crash would skip the grader, and with it every grading attack).
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from orchard.harnesses.base import (
    HarnessAdapter,
    HarnessArtifacts,
    HarnessError,
    HarnessTask,
    ModelEndpoint,
    collect_changes,
    register_adapter,
    write_state_file,
)
from orchard.sandbox import Sandbox

NAME = "redteam"
KIT = Path(__file__).resolve().parent / "kit.py"
RAN_MARKER = "ORCHARD-REDTEAM-RAN"
SNAPSHOT_FILE_BYTES = 4 * 1024 * 1024
SNAPSHOT_TOTAL_BYTES = 96 * 1024 * 1024
SNAPSHOT_MAX_DEPTH = 48
WRAPPER = (
    'echo {marker}; {program} "$HOME/.orchard/harness/{name}/attack.{lang}"; echo "ORCHARD-REDTEAM-EXIT=$?"; exit 0'
)
"""Runs the attack and always exits 0, so the episode is graded."""


@dataclass
class Snapshot:
    """What an episode's sandbox held when the harness was done: regular files of the working copy and home."""

    files: dict[str, bytes] = field(default_factory=dict)
    patch: str = ""
    collect_error: str = ""


SNAPSHOTS: dict[str, Snapshot] = {}
"""By episode id, filled by ``collect``."""


class AttackAdapter(HarnessAdapter):
    """Runs one attack script (``sh`` or ``py``) as the harness."""

    name: ClassVar[str] = NAME

    def __init__(self, script: str, lang: Literal["sh", "py"] = "sh", timeout_s: float = 20.0) -> None:
        self.script, self.lang, self.timeout_s = script, lang, timeout_s

    def prepare(self, sandbox: Sandbox, endpoint: ModelEndpoint, task: HarnessTask) -> None:
        write_state_file(sandbox, self.state("kit.py"), KIT.read_bytes())
        write_state_file(sandbox, self.state(f"attack.{self.lang}"), self.script)

    def command(self, endpoint: ModelEndpoint, task: HarnessTask) -> list[str]:
        program = "python3" if self.lang == "py" else "/bin/sh"
        return ["/bin/sh", "-c", WRAPPER.format(marker=RAN_MARKER, program=program, name=NAME, lang=self.lang)]

    def environment(self, endpoint: ModelEndpoint, task: HarnessTask) -> dict[str, str]:
        """What a real harness gets: the proxy's base URL, the episode's token, the model."""
        return {
            "OPENAI_BASE_URL": endpoint.base_url,
            "OPENAI_API_KEY": endpoint.api_key.get_secret_value(),
            "OPENAI_MODEL": endpoint.model,
        }

    def exec_timeout_s(self, task: HarnessTask) -> float:
        return self.timeout_s

    def collect(self, sandbox: Sandbox, task: HarnessTask) -> HarnessArtifacts:
        snapshot = Snapshot()
        try:
            snapshot.patch, _ = collect_changes(sandbox, task.workdir)
        except HarnessError as exc:
            snapshot.collect_error = str(exc)
        directory = getattr(sandbox, "directory", None)
        if directory is not None:
            for sub in ("work", "home", "tmp"):
                read_tree(Path(directory) / sub, snapshot.files)
        SNAPSHOTS[sandbox.spec.episode_id] = snapshot
        return HarnessArtifacts(harness=NAME, patch=snapshot.patch)


def read_tree(root: Path, into: dict[str, bytes]) -> None:
    """Regular files under ``root`` (host side, as root: no symlink followed, no FIFO opened), each cut at
    ``SNAPSHOT_FILE_BYTES``, until ``SNAPSHOT_TOTAL_BYTES`` are read; iterative, as deep nesting is an attack."""
    stack, total = [(root, 0)], sum(len(v) for v in into.values())
    while stack and total < SNAPSHOT_TOTAL_BYTES:
        directory, depth = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False) and depth < SNAPSHOT_MAX_DEPTH:
                    stack.append((Path(entry.path), depth + 1))
                elif entry.is_file(follow_symlinks=False):
                    data = _read_regular(entry.path)
                    into[entry.path] = data
                    total += len(data)


def _read_regular(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return os.read(fd, SNAPSHOT_FILE_BYTES)
    finally:
        os.close(fd)


register_adapter(NAME, AttackAdapter)
