"""What a local sandbox's commands see of the machine: an allow-list, built per command by bubblewrap.

A command starts from an empty root (a tmpfs) in which only these exist:

- the **minimal system**, read-only: ``/usr`` and the top-level links or directories into it (``/bin``, ``/sbin``,
  ``/lib*``), and the files of ``/etc`` that programs need to start, resolve names and verify TLS (``ETC_ENTRIES``);
- the **shared directories**, read-only at their own paths: the runtime's interpreter and the packages its Python
  harnesses import (``orchard.sandbox.local.interpreter``), harness installations (``LocalRuntime(shared_paths=...)``);
- the sandbox's **own directories**, writable: the working copy at ``/sandbox/work``, ``$HOME`` at
  ``/sandbox/home``, and its temporary directory as ``/tmp`` and ``/var/tmp`` (host paths are never shown);
- a fresh ``/dev`` (null, zero, random, urandom, tty, pts, and ``/dev/shm`` on the sandbox's own files), a fresh
  ``/proc`` of the command's own PID namespace, and an empty, read-only ``/run``.

Every other path of the host (home directories, other checkouts, other runs and sandboxes, caches, the bus, the
store, task directories with their graders) does not exist inside. Directories above a bound path are created empty
by bubblewrap, so a share under ``/root`` shows only itself. A grading command gets a variant of the view
(``SandboxView.for_grader``): the grader's files read-only at ``GRADER_DIR``, a fresh output directory at
``GRADER_OUT``, a fresh ``/tmp`` and ``$HOME``, and nothing of the agent's but the working copy.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

INSIDE_WORK = "/sandbox/work"
"""The working copy, as a namespaced sandbox's commands see it (its host path is never shown)."""
INSIDE_HOME = "/sandbox/home"
"""``$HOME`` inside a namespaced sandbox."""
INSIDE_ROOT = "/sandbox"
GRADER_DIR = "/orchard/grader"
"""Where a grading command finds the grader's files (read-only), inside a namespaced sandbox."""
GRADER_OUT = "/orchard/out"
"""Where a grading command writes its outputs (``signals.json``), inside a namespaced sandbox."""
TOP_LEVEL_SYSTEM = ("bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr")
"""Top-level entries of the minimal system: on a merged-/usr system all but ``usr`` are symbolic links into it."""
ETC_ENTRIES = (
    "passwd", "group", "hosts", "hostname", "resolv.conf", "nsswitch.conf", "host.conf", "gai.conf", "networks",
    "protocols", "services", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl", "ca-certificates",
    "ca-certificates.conf", "localtime", "timezone", "mime.types", "os-release", "debian_version", "fonts",
    "python3", "python3.11", "python3.12", "python3.13", "chromium", "chromium.d", "bash.bashrc", "inputrc",
    "profile", "shells", "magic", "mailcap", "xdg", "java-17-openjdk", "gitconfig", "vim", "terminfo",
)  # fmt: skip
"""Entries of ``/etc`` a sandbox sees (those that exist): users and groups by name, name resolution, the dynamic
linker, TLS roots, time zone, MIME types, fonts, the alternatives links that ``/usr/bin`` points through. Not: keys,
``shadow``, credentials, cron, systemd, package-manager state."""
TEMPORARY = ("/tmp", "/var/tmp")  # noqa: S108 - the sandbox's own, bound from its directory
DEV_SHM = "/dev/shm"  # noqa: S108 - inside the sandbox
DEV_SHM_MB = 64
"""Size of a grading command's fresh ``/dev/shm``."""
MIB = 1024 * 1024


@dataclass(frozen=True)
class SandboxView:
    """The mounts of one command's root, as bubblewrap options (``bwrap_args``)."""

    writable: tuple[tuple[Path, str], ...]
    """(host path, path inside) pairs bound read-write."""
    shared: tuple[Path, ...] = ()
    """Host directories bound read-only at their own paths."""
    readonly: tuple[tuple[Path, str], ...] = ()
    """(host path, path inside) pairs bound read-only, beside the shared ones."""
    tmpfs: tuple[str, ...] = ()
    """Paths that get a fresh empty tmpfs (for this command only)."""
    dev_shm_mb: int = DEV_SHM_MB
    etc: Path | None = None
    """A staged copy of the allowed ``/etc`` entries (``stage_etc``) bound as ``/etc`` in one mount; ``None``: each
    entry bound on its own (about 40 mounts, ~8 ms more per command)."""

    @classmethod
    def for_sandbox(
        cls, work: Path, home: Path, tmp: Path, shm: Path, shared: Sequence[Path], etc: Path | None = None
    ) -> SandboxView:
        """The view of an agent's command: its working copy, home, temporary and shared-memory directories,
        writable (all four on the sandbox's own files, so ``disk_mb`` bounds them together)."""
        tmp_dir = "/tmp"  # noqa: S108 - the sandbox's own temporary directory, not the host's
        writable = ((work, INSIDE_WORK), (home, INSIDE_HOME), (tmp, tmp_dir), (tmp, "/var/tmp"), (shm, DEV_SHM))  # noqa: S108
        return cls(writable=writable, shared=tuple(shared), etc=etc)

    def for_grader(self, work: Path, home: Path, grader: Path, out: Path) -> SandboxView:
        """The view of a grading command: the working copy (its input), the grader read-only, a fresh output
        directory, home and ``/tmp``; nothing else the agent wrote."""
        writable = ((work, INSIDE_WORK), (home, INSIDE_HOME), (out, GRADER_OUT))
        return dataclasses.replace(
            self,
            writable=writable,
            readonly=((grader, GRADER_DIR),),
            tmpfs=("/tmp", "/var/tmp"),  # noqa: S108
        )

    def bwrap_args(self) -> list[str]:
        """The options that build this view (``bwrap`` adds the namespaces and the command).

        Order matters: fresh tmpfs mounts and the sandbox's ``/tmp`` first, then the shared directories (a
        virtualenv under ``/tmp`` must stay visible), then the rest; each directory above a mount point is made
        world-traversable (0755) first, as bubblewrap would make it 0700 and the sandbox's uid could not reach it."""
        made: set[str] = set()
        args = _system_args(made, self.etc)
        args += ["--dev", "/dev"]
        if not any(inside == DEV_SHM for _, inside in self.writable):  # else the sandbox's own, bound below
            args += ["--perms", "1777", "--size", str(self.dev_shm_mb * MIB), "--tmpfs", DEV_SHM]
        args += ["--proc", "/proc", "--perms", "0755", "--dir", "/run"]  # /run: there, empty, not writable
        made.update(("/dev", "/proc", "/run", DEV_SHM))
        for inside in self.tmpfs:
            args += [*_parents(inside, made), "--perms", "1777", "--tmpfs", inside]
        temporary = [(host, inside) for host, inside in self.writable if inside in TEMPORARY]
        own = [(host, inside) for host, inside in self.writable if inside not in TEMPORARY]
        for option, pairs in (
            ("--bind", temporary),
            ("--ro-bind", [(path, str(path)) for path in self.shared]),
            ("--ro-bind", list(self.readonly)),
            ("--bind", own),
        ):
            for host, inside in pairs:
                args += [*_parents(inside, made), option, str(host), inside]
        return args


def _parents(inside: str, made: set[str]) -> list[str]:
    """``--dir`` options (mode 0755) for the directories above ``inside`` not made yet."""
    args: list[str] = []
    for parent in reversed(Path(inside).parents):
        name = str(parent)
        if name == "/" or name in made:
            continue
        made.add(name)
        args += ["--perms", "0755", "--dir", name]
    return args


def _system_args(made: set[str], etc: Path | None) -> list[str]:
    args: list[str] = []
    for name in TOP_LEVEL_SYSTEM:
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
        made.add(str(path))
    made.add("/etc")
    if etc is not None:
        return [*args, "--ro-bind", str(etc), "/etc"]
    args += ["--perms", "0755", "--dir", "/etc"]
    for name in ETC_ENTRIES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args


def _unreadable_or_private(directory: str, names: list[str]) -> set[str]:
    """Never copied: private keys (``/etc/ssl/private``) and whatever this process cannot read."""
    skipped = {"private"} if Path(directory).name == "ssl" else set()
    return skipped | {name for name in names if not os.access(os.path.join(directory, name), os.R_OK)}


def stage_etc(target: Path, source: Path = Path("/etc")) -> Path:
    """Copy the allowed entries of ``source`` (``ETC_ENTRIES``, symbolic links kept as links) into a new directory
    ``target`` (mode 0755), to be bound as a sandbox's ``/etc`` in one mount."""
    target.mkdir(mode=0o755)
    for name in ETC_ENTRIES:
        entry = source / name
        if entry.is_symlink():
            (target / name).symlink_to(os.readlink(entry))
        elif entry.is_dir():
            shutil.copytree(entry, target / name, symlinks=True, ignore=_unreadable_or_private)
        elif entry.is_file():
            shutil.copy2(entry, target / name)
    return target
