"""The harness adapter interface: configure a real harness to use Orchard's proxy, start it, collect what it left.

A harness is any program that speaks the OpenAI API (chat completions or responses) to a base URL. An adapter never
changes how the harness behaves: it writes the harness's own configuration into the sandbox (``prepare``), names the
command that starts it (``command``, run with ``environment()`` in ``task.workdir``), and reads back its trajectory,
the working copy's changes and its logs (``collect``). ``run_harness`` does the three in order through the
``Sandbox`` interface only, so the same adapter runs on the local and the Kubernetes runtime.

Where adapter files live: ``$HOME/.orchard/harness/<adapter name>/`` inside the sandbox (configs, the task text,
trajectories), never in the working copy, so the agent's ``git status`` and the final patch show only the agent's own
changes, exactly as in deployment. Files there are written and read with ``sh`` and ``cat`` through
``Sandbox.exec`` (``Sandbox.write_file`` is confined to the working copy), and commands reach them through
``"$HOME"`` expanded by ``/bin/sh`` inside the sandbox, so no adapter needs to know the sandbox's absolute paths.

Secrets (the per-episode proxy token) are passed only in the command's environment, never in files or argv.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import shlex
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from orchard.exceptions import OrchardError
from orchard.logging import get_logger
from orchard.sandbox import Sandbox

log = get_logger("orchard.harnesses")

STATE_DIR = ".orchard/harness"
"""Adapter files live under ``$HOME/<STATE_DIR>/<adapter name>/`` inside the sandbox."""
EXIT_GRACE_S = 30.0
"""The sandbox kills a harness this long after ``task.timeout_s`` (its own limit), so it can save its trajectory."""
SETUP_TIMEOUT_S = 60.0
COLLECT_TIMEOUT_S = 120.0
_SAFE_RELPATH = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
_PATCH_MARKER = "\0ORCHARD-PATCH\0"
_NOT_A_REPOSITORY = 100


# ---------------------------------------------------------------------------------------------------- errors
class HarnessError(OrchardError):
    """Base class of harness adapter errors."""


class UnknownHarnessError(HarnessError, KeyError):
    """No adapter is registered under that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown harness"


class HarnessNotInstalledError(HarnessError):
    """The harness's executable or package is missing; the message says how to install it."""


class HarnessSetupError(HarnessError):
    """Writing the harness's files into the sandbox, or reading them back, failed."""


# ---------------------------------------------------------------------------------------------------- values
class ModelEndpoint(BaseModel):
    """Where the harness sends its model calls: the proxy's OpenAI base URL as seen from inside the sandbox."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(description="OpenAI base URL including the version prefix, e.g. http://127.0.0.1:9000/v1.")
    api_key: SecretStr = Field(description="The per-episode proxy token the harness presents as its API key.")
    model: str = Field(min_length=1, description="Model id the harness asks for (the proxy serves the policy).")

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {value!r}")
        return value.rstrip("/")

    @classmethod
    def inside(cls, sandbox: Sandbox, api_key: str, model: str, version_prefix: str = "/v1") -> ModelEndpoint:
        """The endpoint of ``sandbox``'s proxy as the sandbox reaches it (its ``proxy_endpoint``, else the spec's)."""
        url = sandbox.info().proxy_endpoint or sandbox.spec.proxy_url
        if url is None:
            raise HarnessSetupError(f"sandbox {sandbox.spec.sandbox_id!r} has no proxy endpoint")
        url = url.rstrip("/")
        base_url = url if url.endswith(version_prefix) else url + version_prefix
        return cls(base_url=base_url, api_key=SecretStr(api_key), model=model)


class HarnessTask(BaseModel):
    """What the harness is asked to do, where, and within which limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instruction: str = Field(min_length=1, description="The task as the user would type it.")
    workdir: str = Field(".", description="Working directory, relative to the sandbox's working copy.")
    max_steps: int = Field(30, ge=1, description="Model calls the harness may make (where the harness can limit it).")
    timeout_s: float = Field(1800.0, gt=0, description="Wall-clock limit the harness is told to respect.")


class HarnessArtifacts(BaseModel):
    """What a harness left behind: its own trajectory files, the working copy's changes, its logs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    harness: str
    exit_status: str | None = Field(None, description="How the harness says it ended, in its own words.")
    final_message: str | None = Field(None, description="The agent's last message or submission, if any.")
    trajectory: dict[str, str] = Field(default_factory=dict, description="Trajectory files: ``~/``-path -> text.")
    patch: str = Field("", description="Binary-safe ``git diff`` of the working copy against its HEAD.")
    changed_files: list[str] = Field(default_factory=list, description="Paths the patch touches (or all files).")
    logs: dict[str, str] = Field(default_factory=dict, description="stdout, stderr and harness log files.")


class HarnessRun(BaseModel):
    """One harness run in one sandbox: how the process ended and what it left."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    harness: str
    exit_code: int | None = Field(description="Exit status; None when the sandbox killed it at the timeout.")
    timed_out: bool
    duration_ms: float
    artifacts: HarnessArtifacts


def merge_config(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` merged in, nested mappings merged key by key (for adapters' ``extra_config``).

    >>> merge_config({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}, "d": 4})
    {'a': {'b': 1, 'c': 3}, 'd': 4}
    """
    merged = dict(base)
    for key, value in override.items():
        current = merged.get(key)
        merged[key] = (
            merge_config(current, value) if isinstance(value, Mapping) and isinstance(current, Mapping) else value
        )
    return merged


# ---------------------------------------------------------------------------------------------------- sandbox files
@dataclass(frozen=True)
class StatePath:
    """A file under an adapter's state directory, ``$HOME/.orchard/harness/<harness>/<relpath>``."""

    harness: str
    relpath: str

    def __post_init__(self) -> None:
        for part in (self.harness, self.relpath):
            if not _SAFE_RELPATH.match(part) or ".." in part.split("/"):
                raise ValueError(f"unsafe state path component {part!r}")

    def shell(self) -> str:
        """The path as a ``/bin/sh`` word (``$HOME`` expands inside the sandbox)."""
        return f'"${{HOME:?}}"/{STATE_DIR}/{self.harness}/{self.relpath}'

    def display(self) -> str:
        """The path for humans and artifact keys: ``~/.orchard/harness/<harness>/<relpath>``."""
        return f"~/{STATE_DIR}/{self.harness}/{self.relpath}"


@dataclass(frozen=True)
class FileText:
    """A command argument that is the text of a state file (``"$(cat FILE)"``; trailing newlines dropped)."""

    path: StatePath


ShellArg = str | StatePath | FileText
"""An argument of ``shell_command``: a literal string, a state file's path, or a state file's text."""


def _shell_word(arg: ShellArg) -> str:
    if isinstance(arg, StatePath):
        return arg.shell()
    if isinstance(arg, FileText):
        return f'"$(cat {arg.path.shell()})"'
    return shlex.quote(arg)


def shell_command(
    argv: Sequence[ShellArg],
    exports: Mapping[str, ShellArg] | None = None,
    setup: Sequence[str] = (),
    after: Sequence[str] = (),
) -> list[str]:
    """``/bin/sh -c 'SETUP...; export K=V...; exec ARGV'``: literal arguments quoted, state paths expanded in the
    sandbox; ``setup`` lines are shell code run first (each must exit the shell itself when it fails). With
    ``after``, ARGV is not exec'd: those lines run once it exits, ``$?`` still its exit status."""
    lines = [*setup, *(f"export {key}={_shell_word(value)}" for key, value in (exports or {}).items())]
    program = " ".join(_shell_word(arg) for arg in argv)
    lines += [program, *after] if after else ["exec " + program]
    return ["/bin/sh", "-c", "; ".join(lines)]


def write_state_file(sandbox: Sandbox, path: StatePath, data: bytes | str) -> None:
    """Create or replace a state file (parents created), through ``sh`` in the sandbox."""
    script = 'f="${HOME:?}/' + STATE_DIR + '/$1"; mkdir -p "${f%/*}" && cat > "$f"'
    payload = data.encode() if isinstance(data, str) else data
    argv = ["/bin/sh", "-c", script, "orchard-write", f"{path.harness}/{path.relpath}"]
    result = sandbox.exec(argv, timeout_s=SETUP_TIMEOUT_S, stdin=payload)
    if result.exit_code != 0:
        raise HarnessSetupError(f"cannot write {path.display()} in the sandbox: {result.stderr.strip()}")


def read_state_file(sandbox: Sandbox, harness: str, relpath: str) -> str | None:
    """A state file's text (UTF-8, undecodable bytes replaced); None if it does not exist."""
    script = 'f="${HOME:?}/' + STATE_DIR + '/$1"; [ -f "$f" ] || exit 3; cat "$f"'
    result = sandbox.exec(["/bin/sh", "-c", script, "orchard-read", f"{harness}/{relpath}"], timeout_s=SETUP_TIMEOUT_S)
    if result.exit_code == 3:
        return None
    if result.exit_code != 0:
        raise HarnessSetupError(f"cannot read ~/{STATE_DIR}/{harness}/{relpath}: {result.stderr.strip()}")
    return result.stdout


def list_state_files(sandbox: Sandbox, harness: str, subdir: str, suffix: str) -> list[str]:
    """Paths (relative to the adapter's state directory) of files under ``subdir`` ending in ``suffix``, sorted."""
    script = 'cd "${HOME:?}/' + STATE_DIR + '/$1" 2>/dev/null || exit 0; [ -d "$2" ] || exit 0; find "$2" -type f'
    result = sandbox.exec(["/bin/sh", "-c", script, "orchard-list", harness, subdir], timeout_s=SETUP_TIMEOUT_S)
    if result.exit_code != 0:
        raise HarnessSetupError(f"cannot list ~/{STATE_DIR}/{harness}/{subdir}: {result.stderr.strip()}")
    return sorted(line for line in result.stdout.splitlines() if line.endswith(suffix))


# ---------------------------------------------------------------------------------------------------- changes
_DIFF_SCRIPT = r"""
export GIT_CEILING_DIRECTORIES="$(dirname "$(pwd -P)")"
export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*'
cd -- "$1" || exit 103
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || exit 100
tmpd=$(mktemp -d) || exit 101
trap 'rm -rf "$tmpd"' EXIT
cp "$(git rev-parse --git-path index)" "$tmpd/index" 2>/dev/null || :
export GIT_INDEX_FILE="$tmpd/index"
if git rev-parse -q --verify HEAD >/dev/null; then base=HEAD; else base=$(git hash-object -t tree /dev/null); fi
git add -A -- . || exit 102
git -c core.quotepath=off diff --cached --name-only -z "$base" -- . || exit 102
printf '\0ORCHARD-PATCH\0'
git -c core.quotepath=off diff --cached --binary --full-index "$base" -- . || exit 102
"""
"""Run from the working copy's root with the workdir as ``$1``: stage everything (``.gitignore`` respected) into a
throwaway index, so the sandbox's own index is untouched, and print the changed paths, a marker, and the binary diff
against HEAD (the empty tree in a repository without commits). Git may not look above the working copy's root, so a
working copy that is no repository never picks up one it happens to lie in (say, the host's checkout)."""


def collect_changes(sandbox: Sandbox, workdir: str) -> tuple[str, list[str]]:
    """The working copy's patch against HEAD and the paths it touches; outside git, no patch and every file."""
    result = sandbox.exec(["/bin/sh", "-c", _DIFF_SCRIPT, "orchard-diff", workdir], timeout_s=COLLECT_TIMEOUT_S)
    return _changes(sandbox, workdir, result.exit_code, result.stdout, result.stderr)


def _changes(sandbox: Sandbox, workdir: str, code: int | None, stdout: str, stderr: str) -> tuple[str, list[str]]:
    """``collect_changes``'s answer from what ``_DIFF_SCRIPT`` printed and its exit status."""
    if code == _NOT_A_REPOSITORY:
        entries = sandbox.list_files(workdir, recursive=True)
        return "", sorted(entry.path for entry in entries if entry.kind == "file")
    if code != 0 or _PATCH_MARKER not in stdout:
        raise HarnessSetupError(f"git diff failed in {workdir!r} ({code}): {stderr.strip()}")
    names, patch = stdout.split(_PATCH_MARKER, 1)
    return patch, [name for name in names.split("\0") if name]


_STATE_MARKERS = ("\0ORCHARD-STATE\0", "\0ORCHARD-NO-STATE\0")
_STATE_THEN_DIFF = (
    'f="${HOME:?}/' + STATE_DIR + '/$1"; shift\n'
    'if [ -f "$f" ]; then cat "$f" || exit 104; printf \'\\0ORCHARD-STATE\\0\'\n'
    "else printf '\\0ORCHARD-NO-STATE\\0'; fi" + _DIFF_SCRIPT
)
"""``read_state_file``'s ``cat`` of ``$1``, a marker saying whether it was there, then ``_DIFF_SCRIPT`` of ``$2``."""


def read_state_file_and_changes(
    sandbox: Sandbox, harness: str, relpath: str, workdir: str, collected: Collected | None = None
) -> tuple[str | None, str, list[str]]:
    """``read_state_file`` and ``collect_changes`` in one sandbox exec instead of two (each exec starts a sandboxed
    process, and every episode pays for it): the state file's text (None if absent; a text file without NUL bytes,
    such as a JSONL trajectory), the patch and the paths it touches. ``collected``: what the harness's own command
    printed after the agent (``collect_after_agent``), read instead of running the exec. When the exec fails, or
    prints what the two would not parse (say, output cut at the runtime's limit), they run the two-exec way and
    answer, or fail, as they do."""
    if collected is None:
        argv = ["/bin/sh", "-c", _STATE_THEN_DIFF, "orchard-collect", f"{harness}/{relpath}", workdir]
        result = sandbox.exec(argv, timeout_s=COLLECT_TIMEOUT_S)
        collected = Collected(result.stdout, result.exit_code, result.stderr)
    marker = next((m for m in _STATE_MARKERS if m in collected.stdout), "")
    text, _, rest = collected.stdout.partition(marker) if marker else ("", "", "")
    diffed = collected.exit_code == _NOT_A_REPOSITORY or (collected.exit_code == 0 and _PATCH_MARKER in rest)
    if not (marker and diffed):
        return read_state_file(sandbox, harness, relpath), *collect_changes(sandbox, workdir)
    state = text if marker == _STATE_MARKERS[0] else None
    return state, *_changes(sandbox, workdir, collected.exit_code, rest, collected.stderr)


@dataclass(frozen=True)
class Collected:
    """What ``_STATE_THEN_DIFF`` printed and its exit status, from an exec of its own or the harness's command."""

    stdout: str
    exit_code: int | None
    stderr: str


_COLLECT_MARKER = "\0ORCHARD-COLLECT\0"
_COLLECTED = re.compile("\0ORCHARD-COLLECTED (\\d+)\0\\Z")


def collect_after_agent(harness: str, relpath: str) -> list[str]:
    """``shell_command``'s ``after`` lines that run ``read_state_file_and_changes``'s script at the end of the
    harness's own command (its working directory is the working copy's root), so an episode needs no collect exec:
    a marker, the script's output, its exit status, then the agent's exit status as the command's. Use it only
    where the command runs in the working copy's root (``HarnessTask.workdir`` "."); ``split_collected`` reads it."""
    script = shlex.quote(_STATE_THEN_DIFF)
    return [
        "s=$?",
        "printf '\\0ORCHARD-COLLECT\\0'",
        f"/bin/sh -c {script} orchard-collect {shlex.quote(f'{harness}/{relpath}')} .",
        "printf '\\0ORCHARD-COLLECTED %d\\0' $?",
        "exit $s",
    ]


def split_collected(stdout: str, stderr: str) -> tuple[str, Collected | None]:
    """The agent's own stdout and what ``collect_after_agent`` printed after it (None when it did not run to its
    end: the command was killed at its deadline, or the output was cut at the runtime's limit). The last marker
    counts: the agent's output before it may hold anything."""
    head, marker, tail = stdout.rpartition(_COLLECT_MARKER)
    status = _COLLECTED.search(tail) if marker else None
    if status is None:
        return stdout, None
    return head, Collected(tail[: status.start()], int(status.group(1)), stderr)


def find_npm_harness(command: str, env_var: str, project_install: Path, install_hint: str) -> str:
    """An npm-installed harness's executable: ``$<env_var>``, the project-local install (``project_install``,
    relative to the checkout or the working directory), or ``command`` on ``PATH``; ``HarnessNotInstalledError``
    naming ``install_hint`` otherwise."""
    explicit = os.environ.get(env_var)
    if explicit:
        return explicit
    repo_root = Path(__file__).resolve().parents[2]
    for candidate in (repo_root / project_install, Path.cwd() / project_install):
        if candidate.exists():
            return str(candidate)
    on_path = shutil.which(command)
    if on_path:
        return on_path
    raise HarnessNotInstalledError(f"{install_hint} not found: run infra/local/install_harnesses.sh or set {env_var}")


# ---------------------------------------------------------------------------------------------------- adapter
class HarnessAdapter(ABC):
    """Configures one kind of harness, names its command, and collects its artifacts (one instance, many runs)."""

    name: ClassVar[str]

    @abstractmethod
    def prepare(self, sandbox: Sandbox, endpoint: ModelEndpoint, task: HarnessTask) -> None:
        """Write the harness's configuration and the task into the sandbox."""

    @abstractmethod
    def command(self, endpoint: ModelEndpoint, task: HarnessTask) -> list[str]:
        """The argv run in the sandbox, in ``task.workdir``, with ``environment()``."""

    def environment(self, endpoint: ModelEndpoint, task: HarnessTask) -> dict[str, str]:
        """Variables added to the sandbox's environment for the command (the API key goes here)."""
        return {}

    def stdin(self, task: HarnessTask) -> bytes:
        """What the command reads on its standard input (default: nothing). An adapter may hand its command a file
        to write this way instead of in an exec of its own in ``prepare``: every exec starts a sandboxed process."""
        return b""

    @abstractmethod
    def collect(self, sandbox: Sandbox, task: HarnessTask) -> HarnessArtifacts:
        """Read back trajectory files, the patch and logs once the command has exited."""

    def collect_run(
        self, sandbox: Sandbox, task: HarnessTask, stdout: str, stderr: str
    ) -> tuple[str, HarnessArtifacts]:
        """The command's own stdout (for the logs) and the artifacts, given what the command printed: ``collect``
        unless the adapter's command collects them itself (``collect_after_agent``)."""
        return stdout, self.collect(sandbox, task)

    def exec_timeout_s(self, task: HarnessTask) -> float:
        """When the sandbox kills the command: the task's limit plus a grace period to save the trajectory."""
        return task.timeout_s + EXIT_GRACE_S

    def state(self, relpath: str) -> StatePath:
        """A file under this adapter's state directory."""
        return StatePath(self.name, relpath)


AdapterFactory = Callable[..., HarnessAdapter]
_FACTORIES: dict[str, AdapterFactory | str] = {
    "builtin": "orchard.harnesses.builtin:BuiltinAgentAdapter",
    "mini-swe-agent": "orchard.harnesses.mini_swe_agent:MiniSweAgentAdapter",
    "codex": "orchard.harnesses.codex_cli:CodexCliAdapter",
    "claude-code": "orchard.harnesses.claude_code:ClaudeCodeAdapter",
    "opencode": "orchard.harnesses.opencode:OpencodeAdapter",
    "pi": "orchard.harnesses.pi:PiAdapter",
}
"""Adapters by name, imported on first use (``module:attribute``): the core's own, then those other packages
declare under the ``orchard.harnesses`` entry-point group (the recipes' ``browser``, ``claw`` and ``openclaw`` in
``pyproject.toml``), so the core names no module above it."""
ENTRY_POINT_GROUP = "orchard.harnesses"
_entry_points_read = False


def _declared_factories() -> dict[str, AdapterFactory | str]:
    """Every adapter known: the registered ones, plus the entry points of ``ENTRY_POINT_GROUP`` (read once) that
    no registration has taken the name of."""
    global _entry_points_read
    if not _entry_points_read:
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            _FACTORIES.setdefault(entry.name, entry.value)
        _entry_points_read = True
    return _FACTORIES


def register_adapter(name: str, factory: AdapterFactory) -> None:
    """Make ``get_adapter(name, **options)`` build adapters with ``factory(**options)`` (replaces an existing one)."""
    _FACTORIES[name] = factory


def adapter_names() -> list[str]:
    """Registered adapter names, sorted."""
    return sorted(_declared_factories())


def get_adapter(name: str, **options: object) -> HarnessAdapter:
    """A new adapter of the harness ``name``, built with ``options`` (see each adapter's constructor)."""
    factory = _declared_factories().get(name)
    if factory is None:
        raise UnknownHarnessError(f"no harness adapter {name!r}; known: {', '.join(adapter_names())}")
    if isinstance(factory, str):
        module, _, attribute = factory.partition(":")
        factory = getattr(importlib.import_module(module), attribute)
        _FACTORIES[name] = factory
    return factory(**options)


# ---------------------------------------------------------------------------------------------------- running
PhaseHook = Callable[[str], None]
"""Told ``"harness-prepared"`` when the harness's command starts and ``"harness-ran"`` when it has exited."""


def run_harness(
    adapter: HarnessAdapter,
    sandbox: Sandbox,
    endpoint: ModelEndpoint,
    task: HarnessTask,
    on_phase: PhaseHook | None = None,
) -> HarnessRun:
    """Prepare, run and collect one harness in ``sandbox``; the process's stdout and stderr join the logs."""
    bound = log.bind(harness=adapter.name, sandbox=sandbox.spec.sandbox_id, episode=sandbox.spec.episode_id)
    started = time.perf_counter()
    adapter.prepare(sandbox, endpoint, task)
    prepared = time.perf_counter()
    if on_phase is not None:
        on_phase("harness-prepared")
    result = sandbox.exec(
        adapter.command(endpoint, task),
        timeout_s=adapter.exec_timeout_s(task),
        cwd=task.workdir,
        env=adapter.environment(endpoint, task),
        stdin=adapter.stdin(task),
    )
    ran = time.perf_counter()
    if on_phase is not None:
        on_phase("harness-ran")
    stdout = result.stdout
    try:
        stdout, artifacts = adapter.collect_run(sandbox, task, result.stdout, result.stderr)
    except Exception as exc:  # noqa: BLE001 - what the agent left must not decide whether the episode is graded
        bound.warning("harness_collect_failed", error=repr(exc)[:500])
        artifacts = HarnessArtifacts(harness=adapter.name, logs={"collect_error": repr(exc)[:2000]})
    logs = {"stdout": stdout, "stderr": result.stderr, **artifacts.logs}
    artifacts = artifacts.model_copy(update={"logs": logs})
    bound.info(
        "harness_finished",
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        exit_status=artifacts.exit_status,
        changed_files=len(artifacts.changed_files),
        prepare_ms=round((prepared - started) * 1000, 1),
        run_ms=round((ran - prepared) * 1000, 1),
        collect_ms=round((time.perf_counter() - ran) * 1000, 1),
    )
    return HarnessRun(
        harness=adapter.name,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        duration_ms=result.duration_ms,
        artifacts=artifacts,
    )
