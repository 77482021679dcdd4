"""Pagination."""

from paginate.pages import Page, page_count, paginate

__all__ = ["Page", "page_count", "paginate"]
