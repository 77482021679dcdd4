"""Roman numeral codec."""

from roman.codec import from_roman, to_roman

__all__ = ["from_roman", "to_roman"]
