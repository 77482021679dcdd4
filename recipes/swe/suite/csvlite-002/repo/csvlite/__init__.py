"""Minimal CSV reading and writing."""

from csvlite.reader import read_records, read_rows
from csvlite.writer import write_rows

__all__ = ["read_records", "read_rows", "write_rows"]
