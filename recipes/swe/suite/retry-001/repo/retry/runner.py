"""Running a callable with retries."""

import time
from collections.abc import Callable
from typing import TypeVar

from retry.policy import backoff_delays

T = TypeVar("T")


def retry(
    func: Callable[[], T],
    attempts: int = 3,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    base: float = 0.1,
    factor: float = 2.0,
    max_delay: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``func`` up to ``attempts`` times, sleeping between failures of the ``retry_on`` types."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    delays = backoff_delays(attempts, base, factor, max_delay)
    for attempt in range(attempts):
        try:
            return func()
        except retry_on:
            if attempt == attempts - 1:
                raise
            sleep(delays[attempt])
    raise AssertionError("unreachable")
