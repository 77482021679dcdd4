"""An interactive command on a pseudo-terminal inside a local sandbox.

The command gets the terminal's slave side as stdin, stdout and stderr and, through ``setsid --ctty`` in its
wrapper, as its controlling terminal (so job control, ``^C`` and ``SIGWINCH`` work); the runtime keeps the master
side. Killing it kills its whole tree, as for ``exec``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pty
import select
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from orchard.sandbox import PtySession
from orchard.sandbox.local.process import kill_tree, shell_status, spawn

OnClose = Callable[["LocalPty"], None]


def set_window_size(fd: int, cols: int, rows: int) -> None:
    """Set a terminal's size (the kernel signals ``SIGWINCH`` to its foreground process group)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class LocalPty(PtySession):
    """A process on a PTY: ``read``/``write`` the master side, ``resize``, ``wait``, ``close``."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        namespaced: bool,
        cols: int,
        rows: int,
        owner: tuple[int, int] | None = None,
        pass_fds: Sequence[int] = (),
        on_close: OnClose | None = None,
    ) -> None:
        """Start ``argv`` (already wrapped with ``setsid --ctty``) on a new terminal of ``cols`` x ``rows``."""
        self.master, slave = pty.openpty()
        self.started = time.monotonic()
        self.output_digest = hashlib.sha256()
        self.output_bytes = 0
        self._namespaced = namespaced
        self._on_close = on_close
        self._closed = False
        self._lock = threading.Lock()
        try:
            set_window_size(slave, cols, rows)
            if owner is not None:
                os.fchown(slave, *owner)
            self.process: subprocess.Popen[bytes] = spawn(
                argv,
                env=env,
                cwd=cwd,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                new_session=namespaced,  # without namespaces the command's own setsid makes it a session leader
                pass_fds=pass_fds,
            )
        except BaseException:
            os.close(self.master)
            raise
        finally:
            os.close(slave)

    def read(self, max_bytes: int = 65536, timeout_s: float = 1.0) -> bytes | None:
        """Output bytes; ``None`` when nothing came within ``timeout_s``; ``b""`` once the terminal closed."""
        if self._closed:
            return b""
        ready, _, _ = select.select([self.master], [], [], timeout_s)
        if not ready:
            return None
        try:
            data = os.read(self.master, max_bytes)
        except OSError:  # EIO: every slave descriptor is closed, the session is over
            return b""
        self.output_digest.update(data)
        self.output_bytes += len(data)
        return data

    def write(self, data: bytes) -> None:
        """Send input to the process."""
        view = memoryview(data)
        while view:
            written = os.write(self.master, view)
            view = view[written:]

    def resize(self, cols: int, rows: int) -> None:
        """Change the terminal size."""
        set_window_size(self.master, cols, rows)

    def wait(self, timeout_s: float | None = None) -> int | None:
        """The shell-style exit status, or ``None`` if still running after ``timeout_s``."""
        try:
            return shell_status(self.process.wait(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            return None

    @property
    def duration_ms(self) -> float:
        """Time since the start."""
        return (time.monotonic() - self.started) * 1000.0

    def close(self) -> None:
        """Kill the process tree and release the terminal (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.process.poll() is None:
            kill_tree(self.process, namespaced=self._namespaced)
        self.process.wait()
        os.close(self.master)
        if self._on_close is not None:
            self._on_close(self)
