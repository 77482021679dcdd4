"""The seccomp filter every local sandbox command runs under: the system calls an episode never needs fail ``EPERM``.

An agent's commands run unprivileged (own uid, no capabilities, ``no_new_privs``), so most of these calls would fail
anyway; the filter is the second wall, for kernel bugs reachable from an unprivileged process and for the calls that
need no privilege at all (new user namespaces, kernel keyrings, ``userfaultfd``, ``io_uring``). The program is
compiled once per process with libseccomp (``pyseccomp``) into classic BPF, which bubblewrap loads right before it
starts the command (``--seccomp FD``), after its own set-up.

What is refused, by class:

- **mounts and roots**: ``mount``, ``umount2``, ``pivot_root``, ``chroot``, the new mount API (``fsopen`` ...);
- **namespaces**: ``setns``, and ``unshare``/``clone`` with ``CLONE_NEWUSER`` (the door to every other namespace
  for an unprivileged process); ``clone3`` reports ``ENOSYS`` so that libc falls back to ``clone``, whose flags the
  filter can see;
- **other processes**: ``ptrace``, ``process_vm_readv``/``writev``, ``kcmp``, ``pidfd_getfd``;
- **the kernel itself**: module loading, ``kexec``, ``reboot``, ``swapon``/``swapoff``, ``acct``, ``quotactl``,
  ``syslog``, ``iopl``/``ioperm``, clock setting, ``perf_event_open``, ``bpf``, ``userfaultfd``, ``io_uring``,
  ``open_by_handle_at``/``name_to_handle_at`` (reads files by inode, past any mount), kernel keyrings.
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile

from orchard.sandbox.exceptions import SandboxStartError

CLONE_NEWUSER = 0x10000000

REFUSED_CALLS = (
    # mounts and roots
    "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsmount", "fsconfig", "fspick", "move_mount",
    "open_tree", "mount_setattr",
    # namespaces
    "setns",
    # other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # the kernel
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff",
    "acct", "quotactl", "syslog", "iopl", "ioperm", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "perf_event_open", "bpf", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "open_by_handle_at", "name_to_handle_at", "keyctl", "add_key", "request_key", "lookup_dcookie", "vhangup",
    "nfsservctl",
)  # fmt: skip
"""Refused with ``EPERM`` whatever their arguments."""


@functools.cache
def sandbox_filter_bpf() -> bytes:
    """The compiled filter (classic BPF for this machine's architecture), built once per process.

    ``SandboxStartError`` when libseccomp is missing (``apt-get install libseccomp2``)."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError) as exc:  # the package is there but libseccomp.so.2 is not
        raise SandboxStartError(f"seccomp needs libseccomp (apt-get install libseccomp2): {exc}") from exc
    refuse = seccomp.ERRNO(errno.EPERM)
    program = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in REFUSED_CALLS:
        try:
            program.add_rule(refuse, name)
        except (ValueError, RuntimeError, OSError):  # a call this architecture does not have (iopl on arm64)
            continue
    new_user = seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)
    program.add_rule(refuse, "unshare", new_user)
    program.add_rule(refuse, "clone", new_user)
    program.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as out:
        program.export_bpf(out)
        out.seek(0)
        return out.read()


def filter_fd() -> int:
    """A fresh readable descriptor holding the compiled filter, for one ``bwrap --seccomp FD`` (which reads it to
    the end): a memfd, closed by the caller once the command has started."""
    data = sandbox_filter_bpf()
    fd = os.memfd_create("orchard-seccomp", 0)  # no CLOEXEC: the command must inherit it (pass_fds keeps only it)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd
