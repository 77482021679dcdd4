"""What the adapters of headless CLI harnesses (Claude Code, opencode, pi) share.

Each runs its harness's own executable with the task text on stdin from ``task.md`` and its JSON event stream
(one event a line) on stdout into ``events.jsonl``, both in the adapter's state directory; the proxy token travels in
one environment variable (``token_env``); and what it collects is the events, the working copy's changes (in one
exec), and the harness's own files under one directory of its state (session transcripts, logs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from orchard.harnesses.base import (
    HarnessAdapter,
    HarnessTask,
    ModelEndpoint,
    ShellArg,
    list_state_files,
    read_state_file,
    read_state_file_and_changes,
    shell_command,
    write_state_file,
)
from orchard.sandbox import Sandbox

TASK_FILE = "task.md"
EVENTS_FILE = "events.jsonl"


def check_token_limits(context_tokens: int, output_tokens: int) -> None:
    """``ValueError`` unless both of the model's token limits are positive."""
    if context_tokens < 1 or output_tokens < 1:
        raise ValueError(f"token limits must be positive, got {context_tokens} and {output_tokens}")


@dataclass(frozen=True)
class HeadlessOutput:
    """What a headless run left: its events, its own files (by ``~/`` path), and the working copy's changes."""

    events: str
    files: dict[str, str]
    patch: str
    changed_files: list[str]


class HeadlessCliAdapter(HarnessAdapter):
    """An adapter whose harness reads the task on stdin and writes JSON events on stdout (see the module)."""

    token_env: ClassVar[str]
    """The variable the harness reads the proxy token from."""

    def prepare(self, sandbox: Sandbox, endpoint: ModelEndpoint, task: HarnessTask) -> None:
        """Write the task text (a subclass writes the harness's configuration, then calls this)."""
        write_state_file(sandbox, self.state(TASK_FILE), task.instruction)

    def headless_command(self, argv: Sequence[ShellArg], exports: Mapping[str, ShellArg]) -> list[str]:
        """``shell_command(argv, exports)`` with ``task.md`` on its stdin and its stdout into ``events.jsonl``."""
        *shell, script = shell_command(argv, exports=exports)
        return [*shell, f"{script} < {self.state(TASK_FILE).shell()} > {self.state(EVENTS_FILE).shell()}"]

    def environment(self, endpoint: ModelEndpoint, task: HarnessTask) -> dict[str, str]:
        """The proxy token, under ``token_env``."""
        return {self.token_env: endpoint.api_key.get_secret_value()}

    def collect_output(self, sandbox: Sandbox, task: HarnessTask, subdir: str, suffix: str) -> HeadlessOutput:
        """The events (empty when there are none), the changes, and the state files under ``subdir`` ending in
        ``suffix``."""
        events, patch, changed = read_state_file_and_changes(sandbox, self.name, EVENTS_FILE, task.workdir)
        files: dict[str, str] = {}
        for relpath in list_state_files(sandbox, self.name, subdir, suffix):
            text = read_state_file(sandbox, self.name, relpath)
            if text is not None:
                files[self.state(relpath).display()] = text
        return HeadlessOutput(events or "", files, patch, changed)

    def events_trajectory(self, output: HeadlessOutput) -> dict[str, str]:
        """The events file as a trajectory entry (none when the harness wrote no events)."""
        return {self.state(EVENTS_FILE).display(): output.events} if output.events else {}
