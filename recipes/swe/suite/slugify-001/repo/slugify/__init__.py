"""URL slugs."""

from slugify.slug import slugify

__all__ = ["slugify"]
