"""The commands every sandbox operation of the Kubernetes runtime execs in the pod, built without talking to the
cluster: short POSIX ``sh`` scripts, the argv that wraps a command, and the parsing of what they print.

Every command runs under ``EXEC_WRAPPER`` (``exec_argv``): it changes to the working directory, exports the call's
environment, bounds stdin with ``head -c N`` (exec's stdin has no end-of-file that the v4 streaming protocol can
signal) and runs the command under ``timeout -k 5``, which kills its process group on the node. Task images therefore
need ``/bin/sh``, ``timeout``/``head``/``cat``/``mkdir``/``chmod``/``rm`` (GNU coreutils or busybox 1.30+), ``tar``
(``source_dir``), GNU ``find`` (``list_files``) and ``git`` or ``patch`` (``apply_patch``).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Literal

from orchard.sandbox import FileEntry, SandboxSpec, argv_of
from orchard.sandbox.exceptions import InvalidSandboxRequestError, PathEscapeError

KILL_AFTER_S = 5
EXIT_MISSING, EXIT_IS_DIR = 3, 4
EXEC_WRAPPER = (
    'cd "$1" || exit 126; t=$2; n=$3; m=$4; shift 4; '
    'while [ "$m" -gt 0 ]; do export "$1"; shift; m=$((m - 1)); done; '
    f'if [ "$n" = - ]; then exec timeout -k {KILL_AFTER_S} "$t" "$@" </dev/null; fi; '
    f'head -c "$n" | timeout -k {KILL_AFTER_S} "$t" "$@"'
)
"""Parameters: cwd, timeout, stdin length (``-``: none), env count, ``K=V`` pairs, then the command. Exec's stdin
has no end-of-file the v4 streaming protocol can signal, so ``head -c`` ends it after the announced length."""
READ_SCRIPT = f'[ -e "$1" ] || exit {EXIT_MISSING}; [ -d "$1" ] && exit {EXIT_IS_DIR}; exec cat -- "$1"'
WRITE_SCRIPT = f'[ -d "$1" ] && exit {EXIT_IS_DIR}; mkdir -p -- "$(dirname -- "$1")" && cat > "$1" && chmod "$2" "$1"'
DELETE_SCRIPT = f'[ -e "$1" ] || [ -L "$1" ] || exit {EXIT_MISSING}; exec rm -rf -- "$1"'
PATCH_SCRIPT = (
    "if command -v git >/dev/null 2>&1; then exec git apply --whitespace=nowarn -; fi; exec patch -p1 --batch --forward"
)
_LIST_SCRIPT = (  # a directory: its entries (%P relative to it); anything else: its own entry (empty %P)
    f'[ -e "$1" ] || [ -L "$1" ] || exit {EXIT_MISSING}; '
    '[ -d "$1" ] || exec find -H "$1" -maxdepth 0 -printf \'%%y\\t%%s\\t\\0\'; '
    "exec find -H \"$1\" -mindepth 1 %s-printf '%%y\\t%%s\\t%%P\\0'"
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KINDS: dict[str, Literal["file", "dir", "link"]] = {"f": "file", "d": "dir", "l": "link"}
PTY_SCRIPT = (
    'cd "$1" || exit 126; m=$2; shift 2; while [ "$m" -gt 0 ]; do export "$1"; shift; m=$((m - 1)); done; exec "$@"'
)
"""Parameters: working directory, env count, ``K=V`` pairs, then the command. No ``timeout`` around it: an
interactive program must own the terminal (the sandbox's TTL bounds it)."""


def workspace_path(workspace: str, path: str) -> str:
    """Absolute path in the pod of ``path`` (relative to the working copy); ``PathEscapeError`` if it escapes it.

    Checked by name only: a symlink inside the working copy may point elsewhere in the pod's own filesystem,
    which holds nothing but the episode (the root filesystem is the task image, read-only by default).
    """
    if "\0" in path:
        raise InvalidSandboxRequestError("path contains a NUL byte")
    norm = posixpath.normpath(path or ".")
    if norm.startswith("/") or norm == ".." or norm.startswith("../"):
        raise PathEscapeError(f"path {path!r} leaves the working copy")
    return workspace if norm == "." else f"{workspace}/{norm}"


def exec_argv(
    command: Sequence[str] | str, *, cwd: str, timeout_s: float, env: Mapping[str, str], stdin_len: int | None
) -> list[str]:
    """The argv actually sent to the pod: ``EXEC_WRAPPER``, its parameters, then the command."""
    if not timeout_s > 0:
        raise InvalidSandboxRequestError(f"timeout must be positive, not {timeout_s}")  # `timeout 0` never fires
    for key in env:
        if not _ENV_NAME.match(key):
            raise InvalidSandboxRequestError(f"invalid environment variable name {key!r}")
    argv = argv_of(command)
    n = "-" if stdin_len is None else str(stdin_len)
    params = [cwd, f"{timeout_s:.3f}", n, str(len(env)), *(f"{key}={value}" for key, value in env.items())]
    return ["/bin/sh", "-c", EXEC_WRAPPER, "orchard-exec", *params, *argv]


def list_script(recursive: bool) -> str:
    """The GNU ``find`` script listing ``$1``: NUL-terminated ``type<TAB>size<TAB>relative path`` records."""
    return _LIST_SCRIPT % ("" if recursive else "-maxdepth 1 ")


def parse_listing(raw: bytes, path: str) -> list[FileEntry]:
    """``list_script`` output as entries with paths relative to the working copy, sorted by path."""
    base = posixpath.normpath(path or ".")
    entries = []
    for record in filter(None, raw.split(b"\0")):
        kind, size, name = record.decode("utf-8", "replace").split("\t", 2)
        rel = posixpath.normpath(posixpath.join(base, name)) if name else base
        entries.append(FileEntry(path=rel, kind=_KINDS.get(kind, "other"), size=int(size)))
    return sorted(entries, key=lambda entry: entry.path)


def host_exec_env(spec: SandboxSpec, workspace: str) -> dict[str, str]:
    """What a command sees as the pod's environment on a host-exec node (``node_exec_root``): the spec's variables
    (secret ones included: such a node is a test cluster's) and the proxy URL, with HOME in the working copy.

    >>> spec = SandboxSpec(sandbox_id="s", run_id="r", episode_id="e", task_id="t", env={"K": "v"}, proxy_url="http://p")
    >>> host_exec_env(spec, "/n/s")
    {'HOME': '/n/s', 'OPENAI_BASE_URL': 'http://p', 'K': 'v'}
    """
    env = {"HOME": workspace}
    if spec.proxy_url is not None:
        env["OPENAI_BASE_URL"] = spec.proxy_url
    return {**env, **spec.env}
