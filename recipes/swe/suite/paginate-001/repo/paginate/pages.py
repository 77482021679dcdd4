"""Pages of a sequence."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Page:
    """One page of results."""

    items: list[Any]
    number: int
    total_pages: int

    @property
    def has_next(self) -> bool:
        """Whether a later page exists."""
        return self.number < self.total_pages


def page_count(total: int, per_page: int) -> int:
    """Number of pages for ``total`` items, at least 1."""
    if per_page < 1:
        raise ValueError(f"per_page must be at least 1, got {per_page}")
    return total // per_page + 1


def paginate(items: Sequence[Any], number: int, per_page: int) -> Page:
    """Page ``number`` (1-based) of ``items``."""
    pages = page_count(len(items), per_page)
    if not 1 <= number <= pages:
        raise ValueError(f"page {number} out of range 1..{pages}")
    start = (number - 1) * per_page
    return Page(list(items[start : start + per_page]), number, pages)
