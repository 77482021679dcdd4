"""The BitSet type."""

from collections.abc import Iterator


class BitSet:
    """Members are integers in ``range(size)``."""

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"size must be non-negative, got {size}")
        self.size = size
        self._bits = 0

    def _check(self, i: int) -> None:
        if not 0 <= i <= self.size:
            raise IndexError(f"bit {i} out of range for size {self.size}")

    def add(self, i: int) -> None:
        """Set bit ``i``."""
        self._check(i)
        self._bits |= 1 << i

    def discard(self, i: int) -> None:
        """Clear bit ``i``."""
        self._check(i)
        self._bits &= ~(1 << i)

    def __contains__(self, i: int) -> bool:
        return 0 <= i < self.size and bool(self._bits >> i & 1)

    def __iter__(self) -> Iterator[int]:
        return (i for i in range(self.size) if self._bits >> i & 1)

    def __len__(self) -> int:
        return bin(self._bits).count("1")
