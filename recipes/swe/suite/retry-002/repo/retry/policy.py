"""The backoff schedule."""


def backoff_delays(attempts: int, base: float = 0.1, factor: float = 2.0) -> list[float]:
    """The ``attempts - 1`` delays slept between attempts: base, base*factor, ..."""
    return [base * factor**i for i in range(attempts - 1)]
