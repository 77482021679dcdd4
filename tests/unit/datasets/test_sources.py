"""Reading dataset files: JSONL lines and Parquet batches, only the columns a layout needs."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchard.datasets.exceptions import DatasetError
from orchard.datasets.sources import count_rows, iter_rows


def test_jsonl_rows_are_numbered_and_bad_lines_carry_their_error(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"a": 1}) + "\n\n{oops\n[1]\n" + json.dumps({"a": 2}) + "\n")
    rows = list(iter_rows(path))
    assert count_rows(path) == 4
    assert [(r.number, r.data) for r in rows] == [(0, {"a": 1}), (1, None), (2, None), (3, {"a": 2})]
    assert rows[1].error is not None and rows[1].error.startswith("invalid JSON")
    assert (rows[2].error, rows[2].raw) == ("a JSONL row must be a JSON object", "[1]\n")


def test_parquet_rows_are_read_in_batches_with_only_the_wanted_columns(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"keep": list(range(10)), "skip": [b"x" * 100] * 10}), path, row_group_size=3)
    rows = list(iter_rows(path, {"keep", "absent"}, batch_rows=4))
    assert count_rows(path) == 10
    assert [(r.number, r.data) for r in rows] == [(i, {"keep": i}) for i in range(10)]


def test_unknown_or_missing_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="unknown file type '.csv'"):
        list(iter_rows(tmp_path / "rows.csv"))
    with pytest.raises(DatasetError, match="no such file"):
        list(iter_rows(tmp_path / "rows.jsonl"))
