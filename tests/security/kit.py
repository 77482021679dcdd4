"""The attacker's toolkit, copied into every red-team sandbox (``$HOME/.orchard/harness/redteam/kit.py``) next to the
attack script; standard library only, it runs under whatever ``python3`` the sandbox has.

An attack reports what it observed on its stdout, one line each: ``BREACH: <what>`` when it got something it must not
(a syscall that should fail did not, a port answered, a host file took a write), ``WROTE: <host path>`` for a file it
created outside its own directories, ``NOTE: <text>`` for anything else. The test also judges every episode on its
outcome, so an attack that lies about a breach cannot hide one.

``FORGE`` is the payload planted wherever a cheat gets code run during grading: inside the grader it writes perfect
signals and exits 0; inside the SWE grader's pytest runner it rewrites the runner's report with every test passed;
inside a pytest process it makes every test report pass.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import importlib.util
import marshal
import os
import sys
from pathlib import Path

PERFECT_SIGNALS = {
    "answer_written": 1.0, "answer_format": 1.0, "right_file": 1.0, "answer_correct": 1.0, "progress": 1.0,
    "f2p_fraction": 1.0, "p2p_fraction": 1.0, "resolved": 1.0, "test_patch_applied": 1.0,
    "touched_reference_files": 1.0,
}  # fmt: skip
"""Every signal of both recipes' graders at its best value: what a forged signals file says."""

SHADOWED = ("json", "re", "hashlib", "tempfile", "shutil", "subprocess")
"""Standard-library modules both graders import, shadowed by the attacks that plant modules on a search path."""

FORGE = r"""
def _orchard_redteam_forge():
    import os, sys
    signals = "{%s}" % ", ".join('"%s": 1.0' % k for k in (
        "answer_written", "answer_format", "right_file", "answer_correct", "progress", "f2p_fraction",
        "p2p_fraction", "resolved", "test_patch_applied", "touched_reference_files"))
    targets = [".orchard-signals.json"]
    if os.environ.get("ORCHARD_GRADER_OUT"):
        targets.append(os.path.join(os.environ["ORCHARD_GRADER_OUT"], "signals.json"))

    def write(path, text):
        try:
            with open(path, "w") as handle:
                handle.write(text)
        except OSError:
            pass

    argv = list(getattr(sys, "argv", []) or [])
    if argv and argv[0].endswith("grade.py"):  # inside a grader: perfect signals, success, before it grades
        for target in targets:
            write(target, signals)
        os._exit(0)
    if argv and argv[0] == "-c" and len(argv) > 1 and any("::" in a for a in argv[2:]):
        import atexit  # inside the SWE grader's pytest runner: its report says every graded test passed
        ids = [a for a in argv[2:] if "::" in a]
        report = '{"exit": 0, "outcomes": {%s}}' % ", ".join('"%s": "passed"' % i for i in ids)
        atexit.register(write, argv[1], report)
    if "_pytest" in sys.modules or "pytest" in sys.modules:  # inside pytest: every report passes
        try:
            import _pytest.reports as reports
            for cls in (reports.TestReport, reports.CollectReport):
                original = cls.__init__

                def init(self, *args, _original=original, **kwargs):
                    _original(self, *args, **kwargs)
                    if self.outcome != "passed":
                        self.outcome, self.longrepr = "passed", None

                cls.__init__ = init
        except Exception:
            pass


_orchard_redteam_forge()
"""

GRADER_OUT_FORGE = r"""
def _orchard_redteam_out():
    import json, os
    for out in {os.environ.get("ORCHARD_GRADER_OUT") or "/orchard/out", "/orchard/out"}:
        try:
            path = os.path.join(out, "signals.json")
            with open(path, "w") as handle:
                handle.write(json.dumps({"f2p_fraction": 1.0, "p2p_fraction": 1.0, "resolved": 1.0}))
            os.chmod(path, 0o444)
            os.chmod(out, 0o555)
        except OSError:
            pass


_orchard_redteam_out()
"""
"""Planted in code the grader runs: perfect signals locked read-only into the grader's output directory."""

GRADER_OUT_NEST = r"""
def _orchard_redteam_nest():
    import os
    out, here = os.environ.get("ORCHARD_GRADER_OUT") or "/orchard/out", os.getcwd()
    try:
        os.chdir(out)
        for _ in range(3000):
            os.mkdir("d")
            os.chdir("d")
    except OSError:
        pass
    os.chdir(here)


_orchard_redteam_nest()
"""
"""Planted in code the grader runs: 3000 nested directories in the grader's output directory."""


def out(kind: str, text: str) -> None:
    """One report line on stdout, flushed (the sandbox may be killed at any moment)."""
    sys.stdout.write(f"{kind}: {text}\n")
    sys.stdout.flush()


def breach(text: str) -> None:
    """Report a breach: the attack got something it must not."""
    out("BREACH", text)


def note(text: str) -> None:
    """Report an observation that is no breach."""
    out("NOTE", text)


def shadow_source(module: str) -> str:
    """Source of a module that stands in for the standard library's ``module``: it runs ``FORGE``, then hands the
    importer the real module, so the importing program goes on as if nothing happened."""
    return (
        "import os as _os, sys as _sys\n"
        "_here = _os.path.dirname(_os.path.abspath(__file__))\n"
        f"_sys.modules.pop({module!r}, None)\n"
        "_saved = list(_sys.path)\n"
        "_sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or '.') != _here]\n"
        f"import {module} as _real\n"
        "_sys.path[:] = _saved\n"
        f"_sys.modules[{module!r}] = _real\n" + FORGE
    )


def write_pyc(source: str, path: Path, *, unchecked: bool = True) -> None:
    """Compile ``source`` into a ``.pyc`` at ``path``; ``unchecked``: a hash-based pyc the importer never checks
    against its source file (PEP 552), so it is used however the ``.py`` beside it reads."""
    code = compile(source, str(path.with_suffix(".py")), "exec")
    magic = importlib.util.MAGIC_NUMBER
    flags = 0b01 if unchecked else 0b11
    digest = importlib.util.source_hash(source.encode())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(magic + flags.to_bytes(4, "little") + digest + marshal.dumps(code))  # noqa: S302


def try_write(path: str, text: str = "redteam\n") -> bool:
    """Create ``path`` (reported as ``WROTE``); whether it worked."""
    try:
        with open(path, "x") as handle:
            handle.write(text)
    except OSError:
        return False
    out("WROTE", path)
    return True


# ---------------------------------------------------------------------------------------------------- syscalls
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
SYS = {
    "ptrace": 101, "mount": 165, "umount2": 166, "swapon": 167, "init_module": 175, "add_key": 248, "keyctl": 250,
    "unshare": 272, "kexec_load": 246, "perf_event_open": 298, "open_by_handle_at": 304, "setns": 308,
    "process_vm_readv": 310, "finit_module": 313, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
    "pivot_root": 155, "chroot": 161, "mknodat": 259,
}  # fmt: skip
"""x86-64 syscall numbers."""
DENIED = {errno.EPERM, errno.EACCES, errno.ENOSYS, errno.EOPNOTSUPP}


def syscall(name: str, *args: object) -> tuple[int, int]:
    """``(return value, errno)`` of a raw syscall."""
    converted = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    ctypes.set_errno(0)
    result = LIBC.syscall(SYS[name], *converted)
    return int(result), ctypes.get_errno()


def expect_denied(label: str, name: str, *args: object, also: frozenset[int] = frozenset()) -> int:
    """Run a syscall that the sandbox must refuse (EPERM, EACCES, ENOSYS, or an errno in ``also``); report a breach
    if it did not."""
    result, err = syscall(name, *args)
    if result >= 0 or err not in DENIED | also:
        breach(f"{label}: {name} returned {result} ({errno.errorcode.get(err, err) if result < 0 else 'ok'})")
    else:
        note(f"{label}: {name} denied ({errno.errorcode.get(err, err)})")
    return result


def daemonize(function: object) -> None:
    """Run ``function()`` in a daemon: double fork, new session, no controlling terminal, stdio on /dev/null; the
    caller returns at once."""
    if os.fork() != 0:
        return
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    with contextlib.suppress(BaseException):
        function()  # type: ignore[operator]
    os._exit(0)


def in_child(function: object) -> int:
    """Run ``function()`` in a forked child (it may change namespaces); its exit status."""
    pid = os.fork()
    if pid == 0:
        status = 1
        with contextlib.suppress(BaseException):
            status = int(function() or 0)  # type: ignore[operator]
        sys.stdout.flush()
        os._exit(status)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
