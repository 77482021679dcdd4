"""The token bucket."""

import time
from collections.abc import Callable


class TokenBucket:
    """Allows bursts up to ``capacity`` and a sustained ``rate`` of tokens per second."""

    def __init__(self, rate: float, capacity: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or capacity <= 0:
            raise ValueError(f"rate and capacity must be positive, got rate={rate} capacity={capacity}")
        self.rate = rate
        self.capacity = capacity
        self._clock = clock
        self._tokens = float(capacity)
        self._updated = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._updated) * self.rate)

    @property
    def tokens(self) -> float:
        """Tokens available now."""
        self._refill()
        return self._tokens

    def allow(self, cost: float = 1.0) -> bool:
        """Take ``cost`` tokens if available; return whether the request is allowed."""
        self._refill()
        if self._tokens >= cost:
            self._tokens -= cost
            return True
        return False

    def wait_time(self, cost: float = 1.0) -> float:
        """Seconds until ``cost`` tokens will be available."""
        self._refill()
        return max(0.0, (cost - self._tokens) / self.rate)
