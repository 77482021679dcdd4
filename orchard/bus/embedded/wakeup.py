"""Wakes this process's embedded consumers when a record is appended in this process.

A consumer with nothing to read sleeps ``POLL_SLEEP_S`` between looks at its partitions, which a writer in another
process cannot shorten (the log is plain files). A writer in the same process can: every append bumps a counter
and wakes the waiters, so a trainer, a sampler and an engine reloader that share a process (``benchmarks/rl_vs_trl.py``,
a notebook) hand records on at once instead of up to 10 ms later. One counter for the whole process: a waiter woken
by another partition's append just looks again.
"""

from __future__ import annotations

import threading

_appended = threading.Condition()
_generation = 0


def generation() -> int:
    """The append counter now; pass it to ``wait`` after a look that found nothing."""
    return _generation


def notify() -> None:
    """Records were appended in this process: wake every waiter."""
    global _generation
    with _appended:
        _generation += 1
        _appended.notify_all()


def wait(seen: int, timeout_s: float) -> None:
    """Sleep until an append in this process after ``seen`` (a ``generation``), at most ``timeout_s``."""
    with _appended:
        _appended.wait_for(lambda: _generation != seen, timeout=max(timeout_s, 0.0))
