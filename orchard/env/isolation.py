"""How the local runtime isolates a sandbox: which kernel features work here, and the command lines that use them.

Detected once per process (``detect_isolation``), in decreasing strength:

- ``root`` (running as root): per sandbox, a short-lived *holder* process creates new mount, network, UTS and IPC
  namespaces and sets up the mounts; the runtime keeps them alive by holding their ``/proc/<pid>/ns/*`` files open
  (so no process id can be recycled into a wrong namespace), and every command enters them (``nsenter``), gets its
  own PID namespace with a fresh ``/proc`` (``unshare --pid --mount-proc``), its rlimits (``prlimit``), and drops
  to the sandbox's own uid/gid with no capabilities, no supplementary groups and ``no_new_privs`` (``setpriv``).
  PID 1 of that namespace is a shell that waits for the command, so the command has ordinary signal semantics;
  killing PID 1 kills every process the command started, daemonised or not.
- ``userns`` (not root, unprivileged user namespaces allowed): the same namespaces inside a user namespace that maps
  the caller to root; commands keep the caller's uid on the host (no per-sandbox uid, so no per-sandbox process
  limit) and run without capabilities.
- ``none``: commands run in their own session and process group with rlimits (and, as root, the sandbox's uid);
  no namespaces, so the host network and ``/tmp`` are shared, and a process that calls ``setsid`` escapes a
  timeout kill.

The holder's mount namespace hides the host's ``/run`` (system daemons' sockets), ``/tmp``, ``/var/tmp`` and
``/dev/shm`` behind private tmpfs mounts
and replaces the runtime's root directory by a tmpfs holding only this sandbox's own directory, so one sandbox
cannot see another's files even where they share a uid. Shared directories (harness installations, the runtime's own
Python: ``orchard.env.interpreter``) come back read-only at their own paths; a directory above one that the
sandbox's uid may not enter (``/root``, 0700) is replaced by a tmpfs holding only the shared directories
(``traversal_masks``), so they are reachable and nothing else in it is. Everything here uses util-linux
(``unshare``, ``nsenter``, ``prlimit``, ``setpriv``, ``setsid``, ``mount``), present on any Debian or Ubuntu.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from orchard.env.exceptions import SandboxStartError
from orchard.env.runtime import Limits
from orchard.logging import get_logger

IsolationMode = Literal["auto", "root", "userns", "none"]
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MIB = 1024 * 1024
PRIVATE_DIRS = ("/run", "/tmp", "/var/tmp", "/dev/shm")  # noqa: S108 - replaced by private tmpfs mounts
"""Host directories every namespaced sandbox sees as its own empty tmpfs (``HOLDER_SCRIPT``)."""
_TOOLS = ("unshare", "nsenter", "prlimit", "setpriv", "setsid", "mount")
_PROBE_TIMEOUT_S = 15.0

HOLDER_SCRIPT = r"""
set -ef
cd "$1"
root="$2" name="$3" size="$4" loopback="$5" shared="$6" masks="$7"
shift 7
IFS_WAS="$IFS"
IFS=:
i=0 stage=""
for p in $shared; do i=$((i+1)); stage="${stage:+$stage:}.orchard-shared/$i"; done
if [ -n "$stage" ]; then mkdir -p $stage; fi
i=0
for p in $shared; do i=$((i+1)); mount -n -c --bind "$p" ".orchard-shared/$i"; done
IFS="$IFS_WAS"
for d in /run /tmp /var/tmp /dev/shm; do
  if [ -d "$d" ]; then mount -n -c -t tmpfs -o "mode=1777,size=$size" orchard-tmp "$d"; fi
done
for d in "$@"; do
  if [ -d "$d" ]; then mount -n -c -t tmpfs -o mode=0755,size=4k orchard-hidden "$d"; fi
done
IFS=:
if [ -n "$masks" ]; then mkdir -p $masks; fi
for m in $masks; do mount -n -c -t tmpfs -o mode=0755,size=64k orchard-mask "$m"; done
IFS="$IFS_WAS"
mkdir -p "$root"
mount -n -c -t tmpfs -o mode=0711,size=64k orchard-root "$root"
mkdir "$root/$name"
mount -n -c --bind . "$root/$name"
IFS=:
if [ -n "$shared" ]; then mkdir -p $shared; fi
i=0
for p in $shared; do i=$((i+1)); mount -n -c -o bind,ro ".orchard-shared/$i" "$p"; done
IFS="$IFS_WAS"
if [ "$loopback" = lo ]; then ip link set lo up 2>/dev/null || true; fi
echo ready
read -r _ || true
"""
"""Run as root of the holder's new mount namespace: ``$1`` sandbox dir, ``$2`` runtime root, ``$3`` sandbox name,
``$4`` tmpfs size, ``$5`` ``lo`` to bring the loopback up here (otherwise the runtime does it through ``setns``),
``$6`` ``:``-separated host directories to share read-only at their own paths even when under a hidden or private
directory (the harness installation, say: staged through the sandbox directory before the tmpfs mounts), ``$7``
``:``-separated *masks*: directories the sandbox's user cannot traverse (``/root``, mode 0700) on the way to a
shared directory, each replaced by an empty tmpfs in which only the shared directories reappear (so the rest of
``/root`` stays invisible; listable, as Python's path-based imports list the directories on ``sys.path``), then
the host directories to hide behind empty tmpfs mounts (canonical paths).
It prints ``ready`` and waits for its stdin to close, so the runtime can open its namespace files first. ``cd`` pins
the sandbox's own directory before the tmpfs hides the runtime root, and ``mount --bind .`` (``-c``: not
canonicalised) brings exactly that directory back under its own path. ``-n``: no utab bookkeeping (it would land
in the private /run, and costs a few ms per mount). Each ``mount`` and ``mkdir`` is a process (a few ms on a busy
machine), so directories are made in one ``mkdir -p`` per step and ``-o bind,ro`` binds read-only in one ``mount``
(util-linux >= 2.27). ``set -f``: paths are never glob patterns."""

NAMESPACES = ("mnt", "net", "uts", "ipc")
"""The namespaces a holder creates (plus ``user`` in ``userns`` mode), as named under ``/proc/<pid>/ns``."""
_NSENTER_OPTION = {"mnt": "--mount", "net": "--net", "uts": "--uts", "ipc": "--ipc", "user": "--user"}

INIT_SCRIPT = 'cd -- "$1" || exit 126; unset OLDPWD; shift; "$@"; exit $?'
"""PID 1 of a command's PID namespace: enter the working directory (``$1``, resolved inside the namespaces, as the
sandbox's user), run the command as a child (so it is not PID 1) and pass its status on. The directory is never
opened on the host side: ``nsenter --wd`` would hand the command a directory of the host's mount tree, from which
``..`` leads out of the sandbox's private view."""

log = get_logger("orchard.env.isolation")


@dataclass(frozen=True)
class Isolation:
    """What works on this machine, and the argv prefixes that apply it."""

    mode: Literal["root", "userns", "none"]
    tools: dict[str, str] = field(default_factory=dict)
    reason: str = ""

    @property
    def namespaces(self) -> bool:
        """Commands run in the sandbox's mount/net/UTS/IPC namespaces and their own PID namespace."""
        return self.mode != "none"

    @property
    def drop_uid(self) -> bool:
        """Commands run as the sandbox's own uid (the runtime is root)."""
        return self.mode == "root" or (self.mode == "none" and os.geteuid() == 0 and "setpriv" in self.tools)

    def describe(self) -> str:
        """A few words for ``SandboxInfo.isolation`` and logs."""
        parts = {
            "root": "pid+mount+net+uts+ipc namespaces, own uid, no capabilities, rlimits",
            "userns": "user+pid+mount+net+uts+ipc namespaces, host uid, no capabilities, rlimits",
            "none": "own session and process group, rlimits" + (", own uid" if self.drop_uid else ""),
        }
        return parts[self.mode]

    @property
    def namespace_names(self) -> tuple[str, ...]:
        """The ``/proc/<pid>/ns`` entries of a holder to keep open."""
        return ("user", *NAMESPACES) if self.mode == "userns" else NAMESPACES

    def holder_argv(
        self,
        sandbox_dir: Path,
        root_dir: Path,
        tmp_mb: int,
        hidden: Sequence[Path] = (),
        shared: Sequence[Path] = (),
        masks: Sequence[Path] = (),
    ) -> list[str]:
        """The process that creates a sandbox's namespaces (prints ``ready`` once its mounts are in place);
        ``hidden``: host directories the sandbox sees empty; ``shared``: host directories it sees read-only;
        ``masks``: untraversable directories above shared ones, which it sees as empty directories holding only
        the shared ones (``traversal_masks``)."""
        unshare = [self.tools["unshare"], "--mount", "--net", "--uts", "--ipc", "--propagation", "private"]
        if self.mode == "userns":
            unshare.insert(1, "--map-root-user")
        loopback = "" if self.mode == "root" else "lo"
        shared_arg, masks_arg = ":".join(str(p) for p in shared), ":".join(str(p) for p in masks)
        script_args = [str(sandbox_dir), str(root_dir), sandbox_dir.name, f"{tmp_mb}m", loopback, shared_arg]
        script_args.append(masks_arg)
        script_args += [str(p) for p in hidden]
        return [*unshare, "--", "/bin/sh", "-c", HOLDER_SCRIPT, "orchard-holder", *script_args]

    def command_argv(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        limits: Limits,
        namespace_fds: dict[str, int] | None,
        uid: int | None,
        pty: bool = False,
    ) -> list[str]:
        """Wrap ``argv`` so it runs inside the sandbox: namespaces, rlimits, dropped privileges, optional ctty.

        ``namespace_fds`` (by ``/proc/<pid>/ns`` name) must be passed to the child (``pass_fds``)."""
        chain: list[str] = []
        if self.namespaces:
            if not namespace_fds:
                raise SandboxStartError("a namespaced sandbox needs its namespace files")
            chain.append(self.tools["nsenter"])
            chain += [f"{_NSENTER_OPTION[name]}=/proc/self/fd/{fd}" for name, fd in namespace_fds.items()]
            if "user" in namespace_fds:  # setgroups is denied in a --map-root-user namespace; the uid maps to 0
                chain.append("--preserve-credentials")
            chain += ["--", self.tools["unshare"], "--pid", "--fork", "--kill-child", "--mount-proc"]
            chain.append("--")
        chain += [self.tools["prlimit"], *rlimit_args(limits, per_uid=uid is not None), "--"]
        chain += self._privilege_drop(uid)
        if pty:
            chain += [self.tools["setsid"], "--ctty", "--"]
        if self.namespaces:
            chain += ["/bin/sh", "-c", INIT_SCRIPT, "orchard-init", cwd]
        return [*chain, *argv]

    def _privilege_drop(self, uid: int | None) -> list[str]:
        if self.mode == "none" and uid is None:
            return []
        setpriv = [self.tools["setpriv"]]
        if uid is not None:
            setpriv += [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        if self.namespaces:
            setpriv += ["--pdeathsig=SIGKILL"]
        return [*setpriv, "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]


def rlimit_args(limits: Limits, *, per_uid: bool) -> list[str]:
    """``prlimit`` options for ``limits`` (soft = hard). RLIMIT_NPROC counts every process of a uid on the machine,
    so it is set only when the sandbox has a uid of its own (``per_uid``)."""
    args = [
        "--core=0",
        f"--cpu={limits.cpu_seconds}",
        f"--as={limits.memory_mb * MIB}",
        f"--nofile={limits.open_files}",
        f"--fsize={limits.file_size_mb * MIB}",
    ]
    if per_uid:
        args.append(f"--nproc={limits.processes}")
    return args


def traversal_masks(shared: Sequence[Path]) -> list[Path]:
    """The directories to mask (``holder_argv``'s ``masks``) so a sandbox's own uid reaches every ``shared`` path.

    For each shared path, the topmost ancestor that others may not traverse (no ``o+x``; the sandbox's uid is
    "other" to every host file), such as ``/root`` (0700) above a pyenv interpreter: inside the sandbox's mount
    namespace it becomes an empty tmpfs in which only the shared paths are bound back, so nothing else under it
    becomes visible. Masks under another mask are dropped (the outer one covers them).
    """
    found: set[Path] = set()
    for path in shared:
        for ancestor in reversed(path.parents):  # from "/" down
            try:
                mode = ancestor.stat().st_mode
            except OSError:
                break
            if ancestor != Path("/") and not mode & stat.S_IXOTH:
                found.add(ancestor)
                break
    return sorted(m for m in found if not any(m != other and m.is_relative_to(other) for other in found))


def reachable_unchanged(path: Path, *, root: Path, hidden: Sequence[Path]) -> bool:
    """Whether a sandbox's commands see ``path`` as the host does without sharing it: not under a private directory
    (``PRIVATE_DIRS``), a hidden one or the runtime's root, and traversable by others all the way down."""
    covered = [*(Path(d) for d in PRIVATE_DIRS), root, *hidden]
    if any(path.is_relative_to(directory) for directory in covered):
        return False
    return not traversal_masks([path])


def _find_tools() -> dict[str, str]:
    found = {name: shutil.which(name, path=SYSTEM_PATH) for name in _TOOLS}
    return {name: path for name, path in found.items() if path}


def _probe(argv: list[str]) -> str | None:
    """Run a probe command; ``None`` if it worked, else why not."""
    try:
        done = subprocess.run(  # noqa: S603 - fixed argv of system tools
            argv, capture_output=True, timeout=_PROBE_TIMEOUT_S, env={"PATH": SYSTEM_PATH}, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        return done.stderr.decode(errors="replace").strip() or f"exit status {done.returncode}"
    return None


def _try_namespaces(mode: Literal["root", "userns"], tools: dict[str, str]) -> str | None:
    missing = [name for name in _TOOLS if name not in tools]
    if missing:
        return f"missing tools: {', '.join(missing)}"
    if mode == "root" and os.geteuid() != 0:
        return "not running as root"
    user = ["--map-root-user"] if mode == "userns" else []
    probe = [tools["unshare"], *user, "--mount", "--net", "--uts", "--ipc", "--pid", "--fork", "--mount-proc"]
    return _probe([*probe, "--propagation", "private", "--", "/bin/sh", "-c", "mount -t tmpfs orchard-probe /tmp"])


@functools.cache
def detect_isolation(requested: IsolationMode = "auto") -> Isolation:
    """The strongest isolation that works (``auto``), or exactly ``requested`` (``SandboxStartError`` if it does not
    work). Probes the kernel once per process and mode; a fallback is logged as a warning saying why."""
    tools = _find_tools()
    if "prlimit" not in tools:
        raise SandboxStartError("the local runtime needs util-linux's prlimit (apt-get install util-linux)")
    candidates: list[Literal["root", "userns"]]
    if requested == "none":
        return Isolation("none", tools, "requested")
    candidates = [requested] if requested != "auto" else (["root"] if os.geteuid() == 0 else []) + ["userns"]
    reasons: list[str] = []
    for mode in candidates:
        reason = _try_namespaces(mode, tools)
        if reason is None:
            log.info("sandbox_isolation", mode=mode)
            return Isolation(mode, tools)
        reasons.append(f"{mode}: {reason}")
    why = "; ".join(reasons)
    if requested != "auto":
        raise SandboxStartError(f"isolation {requested!r} does not work here ({why})")
    log.warning(
        "sandbox_isolation_degraded",
        mode="none",
        reason=why,
        effect="no namespaces: sandboxes share the host network, /tmp and process table",
    )
    return Isolation("none", tools, why)
