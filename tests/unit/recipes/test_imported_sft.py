"""The imported-SFT recipe's sample dataset and recipe file: the rows are what ``orchard import`` reads, and the
recipe's stage count, run id and tokenizer agree with the dataset and the trained model."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from orchard.datasets.conversation import ChatTokenizer
from orchard.datasets.exceptions import RowError
from orchard.datasets.layouts import extract, layout_with_overrides
from orchard.datasets.sources import iter_rows
from orchard.run.config import CommandComponent, PolicyTrainerComponent, load_run_config
from recipes.imported_sft.sample_data import is_successful, main, sample_rows, write_sample_dataset

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "imported_sft" / "recipe.yaml"


def test_sample_rows_read_through_the_orchard_swe_layout_split_into_calls_with_labels_by_row_parity() -> None:
    layout, tokenizer = layout_with_overrides("orchard-swe"), ChatTokenizer.load("tiny")
    for index, row in enumerate(sample_rows(6)):
        fields = extract(row, layout)
        assert fields.success is is_successful(index) and fields.reward == float(is_successful(index))
        assert fields.task_id is not None and fields.task_id.endswith(f"-{index:05d}")
        assert fields.episode_id is None  # derived by the import from run, file and row
        assert fields.model == "synthetic-teacher" and [t["function"]["name"] for t in fields.tools] == ["shell"]
        passed = fields.signals["tests_passed_fraction"]
        assert passed == 1.0 if is_successful(index) else 0.0 < passed < 1.0
        calls = tokenizer.split(fields.messages, fields.tools)
        assert len(calls) == 3 and calls[1].tool_calls and not calls[2].tool_calls


def test_bad_rows_come_last_and_fail_extraction_as_invalid_json() -> None:
    rows = sample_rows(3, bad_rows=2)
    assert len(rows) == 5
    for row in rows[3:]:
        with pytest.raises(RowError) as raised:
            extract(row, layout_with_overrides("orchard-swe"))
        assert raised.value.error_type == "InvalidJsonError"


def test_parquet_and_jsonl_files_hold_the_same_rows_and_the_same_arguments_write_the_same_file(tmp_path: Path) -> None:
    summary = write_sample_dataset(tmp_path / "a" / "data.parquet", 5, bad_rows=1, seed=3)
    write_sample_dataset(tmp_path / "b.parquet", 5, bad_rows=1, seed=3)
    write_sample_dataset(tmp_path / "c.jsonl", 5, bad_rows=1, seed=3)
    assert (summary.rows, summary.successful, summary.bad_rows) == (6, 3, (5,))
    assert (tmp_path / "a" / "data.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    parquet = pq.read_table(tmp_path / "b.parquet").to_pylist()
    jsonl = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert parquet == jsonl == sample_rows(5, bad_rows=1, seed=3)
    assert [row.number for row in iter_rows(tmp_path / "b.parquet", {"messages", "verify_status"})] == list(range(6))
    assert sample_rows(5, seed=4) != sample_rows(5, seed=3)


def test_command_line_writes_the_file_and_says_what_it_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main([str(tmp_path / "out.parquet"), "--rows", "4", "--bad-rows", "1"])
    assert pq.read_metadata(tmp_path / "out.parquet").num_rows == 5
    assert capsys.readouterr().out.startswith(
        f"wrote 5 rows to {tmp_path / 'out.parquet'}: 2 successful, 2 failed, 1 malformed"
    )


def test_recipe_imports_the_run_dirs_dataset_for_its_run_and_waits_for_the_sample_datasets_successful_rows() -> None:
    recipe = load_run_config(RECIPE)
    assert [stage.name for stage in recipe.stages] == ["import", "sft"]
    importer = recipe.components["import"]
    assert isinstance(importer, CommandComponent)
    words = importer.run
    assert words[:3] == ["orchard", "import", "{run_dir}/dataset.parquet"]
    assert words[words.index("--run-id") + 1] == recipe.run_id
    assert words[words.index("--tokenizer") + 1] == "tiny" and words[words.index("--layout") + 1] == "orchard-swe"
    until = recipe.stages[0].until
    assert until is not None and until.exits == ["import"] and until.topic == "samples"
    assert until.count == sum(is_successful(index) for index in range(32))  # sample_data's default --rows
    trainer = recipe.components["trainer"]
    assert isinstance(trainer, PolicyTrainerComponent) and recipe.model == "tiny-llama"
    assert "model={type: tiny, name: tiny-llama, seed: 0}" in trainer.set and "loss.kind=sft" in trainer.set
    assert recipe.stages[1].until is not None and recipe.stages[1].until.policy_version == 1
