"""A heap-backed priority scheduler."""

import heapq
import itertools
from typing import Any


class Scheduler:
    """Pops tasks by ascending priority, FIFO among equal priorities."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Any]] = []
        self._order = itertools.count()

    def submit(self, task: Any, priority: int = 0) -> None:
        """Queue ``task``."""
        heapq.heappush(self._heap, (priority, next(self._order), task))

    def pop(self) -> Any:
        """Remove and return the next task."""
        if not self._heap:
            raise IndexError("pop from an empty scheduler")
        return heapq.heappop(self._heap)[-1]

    def drain(self) -> list[Any]:
        """Pop every task in run order."""
        return [self.pop() for _ in range(len(self._heap))]

    def __len__(self) -> int:
        return len(self._heap)
