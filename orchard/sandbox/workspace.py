"""A sandbox's working copy: the task's files copied in without version-control history.

The copy keeps symlinks as symlinks (never copying what they point to, which may be a host secret), skips sockets,
FIFOs and devices, and leaves out every ``.git`` (directory or gitlink file) at any depth: a known reward hack is
reading future commits from the history. ``git_snapshot`` optionally makes the copy a fresh repository with one
commit, so ``git diff`` works for the agent without any history to mine.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

from orchard.sandbox.exceptions import InvalidSandboxRequestError, SandboxStartError

EXCLUDED_NAMES = frozenset({".git"})
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "orchard",
    "GIT_AUTHOR_EMAIL": "orchard@localhost",
    "GIT_COMMITTER_NAME": "orchard",
    "GIT_COMMITTER_EMAIL": "orchard@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}


def copy_source(source: Path, destination: Path, *, max_bytes: int) -> int:
    """Copy ``source`` into the existing empty directory ``destination``; return the bytes copied.

    Raises ``InvalidSandboxRequestError`` when ``source`` is not a directory or holds more than ``max_bytes``.
    """
    if not source.is_dir():
        raise InvalidSandboxRequestError(f"source_dir {source} is not a directory")
    copied = 0

    def ignore(directory: str, names: list[str]) -> set[str]:
        skipped = set()
        for name in names:
            if name in EXCLUDED_NAMES:
                skipped.add(name)
                continue
            mode = os.lstat(os.path.join(directory, name)).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                skipped.add(name)
        return skipped

    def copy_file(src: str, dst: str) -> str:
        nonlocal copied
        copied += os.lstat(src).st_size
        if copied > max_bytes:
            raise InvalidSandboxRequestError(f"source_dir {source} is larger than the disk limit of {max_bytes} bytes")
        return str(shutil.copy2(src, dst, follow_symlinks=False))

    try:
        shutil.copytree(source, destination, symlinks=True, ignore=ignore, copy_function=copy_file, dirs_exist_ok=True)
    except shutil.Error as exc:
        raise SandboxStartError(f"cannot copy {source}: {exc.args[0][:3]}") from exc
    return copied


def chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give ``root`` and everything under it (symlinks themselves, not their targets) to ``uid:gid``."""
    os.lchown(root, uid, gid)
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            os.lchown(os.path.join(directory, name), uid, gid)


def git_snapshot(workdir: Path) -> None:
    """Make ``workdir`` a new git repository whose single commit is its current content (fixed identity and date)."""
    git = shutil.which("git")
    if git is None:
        raise SandboxStartError("git_snapshot needs git on the host")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir), **GIT_IDENTITY}
    steps = (["init", "-q"], ["add", "-A"], ["commit", "-q", "--allow-empty", "--no-verify", "-m", "task"])
    for step in steps:
        done = subprocess.run([git, *step], cwd=workdir, env=env, capture_output=True, check=False)  # noqa: S603
        if done.returncode != 0:
            raise SandboxStartError(f"git {step[0]} in {workdir} failed: {done.stderr.decode(errors='replace')}")
