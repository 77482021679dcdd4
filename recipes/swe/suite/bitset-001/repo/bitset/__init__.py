"""Fixed-size bit sets."""

from bitset.bits import BitSet

__all__ = ["BitSet"]
