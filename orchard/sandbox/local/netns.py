"""Work inside another process's network namespace from one thread of this process.

A network namespace is per thread (``setns(2)`` with ``CLONE_NEWNET`` switches only the calling thread), and a
socket stays in the namespace it was created in. So the runtime can, from a short-lived thread, bring up a
sandbox's loopback interface and open a listening socket on the sandbox's ``127.0.0.1`` that the runtime itself
then serves from the host namespace: the one door out of the sandbox, with no helper process inside it.
Needs ``CAP_SYS_ADMIN`` over the target namespace (root, or the owner of its user namespace).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
_IFREQ = struct.Struct("16sH22x")

T = TypeVar("T")
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(CLONE_NEWNET): {os.strerror(err)}")


@contextlib.contextmanager
def _entered(netns_fd: int) -> Iterator[None]:
    """Switch the calling thread into the namespace of ``netns_fd`` and back (the thread must be one of our own)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(netns_fd)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)


def run_in_netns(netns_fd: int, fn: Callable[[], T]) -> T:
    """Run ``fn`` on a fresh thread inside the network namespace open as ``netns_fd``; return its result or raise."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            with _entered(netns_fd):
                outcome.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            failure.append(exc)

    thread = threading.Thread(target=target, name="orchard-netns", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


def loopback_up() -> None:
    """Bring the current namespace's ``lo`` up (a new network namespace starts with it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = _IFREQ.pack(b"lo", 0)
        flags = _IFREQ.unpack(fcntl.ioctl(probe.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe.fileno(), SIOCSIFFLAGS, _IFREQ.pack(b"lo", flags | IFF_UP))


def listen_loopback(port: int) -> socket.socket:
    """A listening TCP socket on ``127.0.0.1:port`` of the current namespace (``port`` 0: any free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
