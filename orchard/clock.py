"""Wall-clock time as records carry it."""

import time


def now_ms() -> int:
    """Milliseconds since the Unix epoch: the timestamp of records and of events in them."""
    return time.time_ns() // 1_000_000
