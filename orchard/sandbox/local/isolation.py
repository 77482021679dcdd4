"""How the local runtime isolates a sandbox: which kernel features work here, and the command lines that use them.

Detected once per process (``detect_isolation``), in decreasing strength:

- ``root`` (running as root): per sandbox, a short-lived *holder* process creates new network, UTS and IPC namespaces;
  the runtime keeps them alive by holding their ``/proc/<pid>/ns/*`` files open (so no process id can be recycled into a
  wrong namespace) and opens the sandbox's one network door (to the proxy) inside. Every command joins the sandbox's
  cgroup (``orchard.sandbox.local.cgroups``), enters those namespaces (``nsenter``) and then runs under bubblewrap: an
  allow-list root (``orchard.sandbox.local.sandbox_view``), its own PID namespace with a fresh ``/proc``, the seccomp
  filter (``orchard.sandbox.local.seccomp``), its rlimits (``prlimit``), and the sandbox's own uid/gid with no
  capabilities, no supplementary groups and ``no_new_privs`` (``setpriv``). PID 1 of that namespace is bubblewrap's
  reaper; when the command ends, PID 1 exits and the kernel kills every process the command started.
- ``userns`` (not root, unprivileged user namespaces allowed): bubblewrap alone, in a new user namespace that maps
  the caller to itself, with new network (loopback only; no proxy door), UTS, IPC and PID namespaces, the same
  allow-list root and seccomp filter; commands keep the caller's uid (no per-sandbox uid, no cgroups).
- ``none``: commands run in their own session and process group with rlimits (and, as root, the sandbox's uid);
  no namespaces, so they see the host's files, network and ``/tmp``, and a process that calls ``setsid`` escapes a
  timeout kill. Only for machines where nothing else works; a warning says so at start.

The tools are util-linux (``unshare``, ``nsenter``, ``prlimit``, ``setpriv``, ``setsid``) and bubblewrap (``bwrap``,
Debian ``bubblewrap``).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from orchard.logging import get_logger
from orchard.sandbox import Limits
from orchard.sandbox.exceptions import SandboxStartError
from orchard.sandbox.local.sandbox_view import SandboxView

IsolationMode = Literal["auto", "root", "userns", "none"]
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MIB = 1024 * 1024
_TOOLS = ("unshare", "nsenter", "prlimit", "setpriv", "setsid", "bwrap")
_PROBE_TIMEOUT_S = 15.0

HOLDER_ARGV_TAIL = ("/bin/sh", "-c", "echo ready; read -r _ || true", "orchard-holder")
"""The holder prints ``ready`` and waits for its stdin to close, so the runtime can open its namespace files."""

NAMESPACES = ("net", "uts", "ipc")
"""The namespaces a holder creates, as named under ``/proc/<pid>/ns``."""
_NSENTER_OPTION = {"net": "--net", "uts": "--uts", "ipc": "--ipc"}


log = get_logger("orchard.sandbox.local.isolation")


@dataclass(frozen=True)
class Isolation:
    """What works on this machine, and the argv prefixes that apply it."""

    mode: Literal["root", "userns", "none"]
    tools: dict[str, str] = field(default_factory=dict)
    reason: str = ""

    @property
    def namespaces(self) -> bool:
        """Commands run in an allow-list root and their own PID namespace (plus the sandbox's network)."""
        return self.mode != "none"

    @property
    def drop_uid(self) -> bool:
        """Commands run as the sandbox's own uid (the runtime is root)."""
        return self.mode == "root" or (self.mode == "none" and os.geteuid() == 0 and "setpriv" in self.tools)

    @property
    def holds_namespaces(self) -> bool:
        """Each sandbox has a holder whose network namespace its commands share (and the proxy door lives in)."""
        return self.mode == "root"

    @property
    def namespace_names(self) -> tuple[str, ...]:
        """The ``/proc/<pid>/ns`` entries of a holder to keep open."""
        return NAMESPACES if self.holds_namespaces else ()

    def describe(self) -> str:
        """A few words for ``SandboxInfo.isolation`` and logs."""
        parts = {
            "root": "allow-list root (bubblewrap), pid+net+uts+ipc+mount namespaces, seccomp, own uid, "
            "no capabilities, rlimits",
            "userns": "allow-list root (bubblewrap), user+pid+net+uts+ipc+mount namespaces, seccomp, host uid, "
            "no capabilities, rlimits",
            "none": "own session and process group, rlimits" + (", own uid" if self.drop_uid else ""),
        }
        return parts[self.mode]

    def holder_argv(self) -> list[str]:
        """The process that creates a sandbox's network, UTS and IPC namespaces (prints ``ready``)."""
        return [self.tools["unshare"], "--net", "--uts", "--ipc", "--", *HOLDER_ARGV_TAIL]

    def command_argv(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        limits: Limits,
        namespace_fds: dict[str, int] | None,
        uid: int | None,
        view: SandboxView | None = None,
        seccomp_fd: int | None = None,
        cgroup_prefix: Sequence[str] = (),
        whole_sandbox_memory: bool = False,
        pty: bool = False,
    ) -> list[str]:
        """Wrap ``argv`` so it runs inside the sandbox: cgroup, namespaces, allow-list root, seccomp, rlimits,
        dropped privileges, optional ctty. ``namespace_fds`` and ``seccomp_fd`` must be passed to the child
        (``pass_fds``); ``whole_sandbox_memory``: a cgroup limits memory, so the address space is limited only when
        the spec asks for it."""
        chain: list[str] = list(cgroup_prefix)
        if self.namespaces:
            chain += self._enter(namespace_fds, view, seccomp_fd, pty, cwd)
        chain += [self.tools["prlimit"], *rlimit_args(limits, per_uid=uid is not None, whole=whole_sandbox_memory)]
        chain.append("--")
        chain += self._privilege_drop(uid)
        if pty:
            chain += [self.tools["setsid"], "--ctty", "--"]
        return [*chain, *argv]

    def _enter(
        self,
        namespace_fds: dict[str, int] | None,
        view: SandboxView | None,
        seccomp_fd: int | None,
        pty: bool,
        cwd: str,
    ) -> list[str]:
        if view is None or seccomp_fd is None:
            raise SandboxStartError("a namespaced sandbox command needs its view and seccomp filter")
        chain: list[str] = []
        bwrap = [self.tools["bwrap"], "--unshare-pid", "--die-with-parent", "--seccomp", str(seccomp_fd)]
        if self.mode == "root":
            if not namespace_fds:
                raise SandboxStartError("a root-mode sandbox needs its namespace files")
            chain.append(self.tools["nsenter"])
            chain += [f"{_NSENTER_OPTION[name]}=/proc/self/fd/{fd}" for name, fd in namespace_fds.items()]
            chain.append("--")
        else:
            bwrap += ["--unshare-user", "--unshare-net", "--unshare-uts", "--unshare-ipc"]
        if not pty:  # a PTY's command becomes a session leader itself (setsid --ctty)
            bwrap.append("--new-session")
        return [*chain, *bwrap, *view.bwrap_args(), "--chdir", cwd, "--"]

    def _privilege_drop(self, uid: int | None) -> list[str]:
        if self.mode == "none" and uid is None:
            return []
        setpriv = [self.tools["setpriv"]]
        if uid is not None:
            setpriv += [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        if self.namespaces:
            setpriv += ["--pdeathsig=SIGKILL"]
        return [*setpriv, "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]


def rlimit_args(limits: Limits, *, per_uid: bool, whole: bool = False) -> list[str]:
    """``prlimit`` options for ``limits`` (soft = hard). RLIMIT_NPROC counts every process of a uid on the machine,
    so it is set only when the sandbox has a uid of its own (``per_uid``). The address space is limited to
    ``address_space_mb`` when set, else to ``memory_mb`` unless a cgroup already limits the memory of the whole
    sandbox (``whole``)."""
    args = [
        "--core=0",
        f"--cpu={limits.cpu_seconds}",
        f"--nofile={limits.open_files}",
        f"--fsize={min(limits.file_size_mb, limits.disk_mb) * MIB}",
    ]
    address_space = limits.address_space_mb if limits.address_space_mb is not None else None
    if address_space is None and not whole:
        address_space = limits.memory_mb
    if address_space is not None:
        args.append(f"--as={address_space * MIB}")
    if per_uid:
        args.append(f"--nproc={limits.processes}")
    return args


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
        hint = " (apt-get install bubblewrap)" if "bwrap" in missing else ""
        return f"missing tools: {', '.join(missing)}{hint}"
    if mode == "root" and os.geteuid() != 0:
        return "not running as root"
    view = SandboxView(writable=()).bwrap_args()
    bwrap = [tools["bwrap"], "--unshare-pid", "--die-with-parent", *view]
    if mode == "root":
        return _probe([tools["unshare"], "--net", "--uts", "--ipc", "--", *bwrap, "--", "/bin/true"])
    return _probe([*bwrap, "--unshare-user", "--unshare-net", "--unshare-uts", "--unshare-ipc", "--", "/bin/true"])


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
        effect="no namespaces: sandboxes see the host's files and network, and share /tmp and the process table",
    )
    return Isolation("none", tools, why)
