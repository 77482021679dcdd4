"""Rows of local Parquet or JSONL files, streamed with bounded memory.

Parquet is read a batch of rows at a time (``ParquetFile.iter_batches``), and only the columns the layout uses, so
a column of screenshots or patches the import does not need is never loaded. JSONL is read a line at a time; a line
that is not a JSON object becomes a ``SourceRow`` with an ``error`` (the importer dead-letters it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from orchard.datasets.exceptions import DatasetError

PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
BATCH_ROWS = 64  # agent trajectories are large (tens of KB each): a small batch keeps memory flat


@dataclass(frozen=True, slots=True)
class SourceRow:
    """One row: its file, 0-based row number, and the decoded row or why it could not be decoded."""

    path: Path
    number: int
    data: dict[str, Any] | None
    raw: str | None = None
    error: str | None = None


def file_format(path: Path) -> str:
    """``parquet`` or ``jsonl`` from the file's suffix; raise ``DatasetError`` for anything else."""
    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    raise DatasetError(f"{path}: unknown file type {suffix!r}; use .parquet or .jsonl")


def count_rows(path: Path) -> int:
    """Rows in ``path``: the Parquet footer's count, or the JSONL file's non-empty lines (one fast pass)."""
    if _checked_format(path) == "parquet":
        return int(_parquet(path).metadata.num_rows)
    count = 0
    with path.open("rb") as handle:
        for line in handle:
            count += bool(line.strip())
    return count


def iter_rows(path: Path, columns: set[str] | None = None, batch_rows: int = BATCH_ROWS) -> Iterator[SourceRow]:
    """Every row of ``path`` in order; for Parquet only ``columns`` (those present; None: all)."""
    if _checked_format(path) == "parquet":
        yield from _parquet_rows(path, columns, batch_rows)
    else:
        yield from _jsonl_rows(path)


def _checked_format(path: Path) -> str:
    fmt = file_format(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    return fmt


def _parquet(path: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError...
        raise DatasetError(f"{path}: cannot read as Parquet: {exc}") from exc


def _parquet_rows(path: Path, columns: set[str] | None, batch_rows: int) -> Iterator[SourceRow]:
    handle = _parquet(path)
    present = handle.schema_arrow.names
    wanted = present if columns is None else [name for name in present if name in columns]
    number = 0
    for batch in handle.iter_batches(batch_size=batch_rows, columns=wanted):
        for row in batch.to_pylist():
            yield SourceRow(path, number, row)
            number += 1


def _jsonl_rows(path: Path) -> Iterator[SourceRow]:
    number = 0
    with path.open("r", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except ValueError as exc:
                yield SourceRow(path, number, None, raw=line, error=f"invalid JSON: {exc}")
            else:
                if isinstance(data, dict):
                    yield SourceRow(path, number, data)
                else:
                    yield SourceRow(path, number, None, raw=line, error="a JSONL row must be a JSON object")
            number += 1
