"""Word wrapping."""

from wordwrap.wrap import fill, wrap

__all__ = ["fill", "wrap"]
