"""The backoff schedule."""


def backoff_delays(attempts: int, base: float = 0.1, factor: float = 2.0, max_delay: float | None = None) -> list[float]:
    """The ``attempts - 1`` delays slept between attempts: base, base*factor, ... capped at ``max_delay``."""
    delays = []
    for i in range(attempts - 1):
        delay = base * factor ** (i + 1)
        if max_delay is not None:
            delay = min(delay, max_delay)
        delays.append(delay)
    return delays
