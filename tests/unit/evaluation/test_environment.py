"""Where a result was measured: Python, the libraries that round a model's numbers, the CPU and its vector
extensions; recorded in every results row and named under the table."""

from __future__ import annotations

import platform
from dataclasses import replace
from importlib import metadata
from pathlib import Path

from orchard.evaluation.environment import describe, software_environment
from orchard.evaluation.results import read_rows, record_stage, render_markdown
from tests.unit.evaluation.test_results import result

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9654
flags\t\t: fpu sse2 avx avx2 avx512f

processor\t: 1
model name\t: AMD EPYC 9654
flags\t\t: fpu sse2 avx avx2 avx512f
"""


def test_the_environment_names_python_the_installed_libraries_and_the_cpu_with_its_widest_vector_set(
    tmp_path: Path,
) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO)

    env = software_environment(cpuinfo)

    assert env["python"] == platform.python_version()
    assert env["numpy"] == metadata.version("numpy")
    assert env["cpu"] == "AMD EPYC 9654"
    assert env["cpu_vector"] == "avx512f"
    assert describe(env).endswith(f"numpy {env['numpy']}, CPU AMD EPYC 9654 (avx512f)")


def test_a_machine_without_cpuinfo_still_records_its_software(tmp_path: Path) -> None:
    env = software_environment(tmp_path / "absent")

    assert "cpu" not in env and "cpu_vector" not in env
    assert env["python"] == platform.python_version()


def test_every_recorded_row_carries_its_environment_and_the_table_names_it_once_when_shared(tmp_path: Path) -> None:
    record_stage(tmp_path, result("sft", [True, False]))
    record_stage(tmp_path, result("rl", [True, True]))

    rows = read_rows(tmp_path)
    assert rows[0].environment == rows[1].environment == software_environment()
    notes = [line for line in (tmp_path / "results.md").read_text().splitlines() if "measured with" in line]
    assert notes == [f"- measured with {describe(software_environment())}"]


def test_rows_measured_in_different_environments_are_each_named_and_old_rows_without_one_are_not(
    tmp_path: Path,
) -> None:
    record_stage(tmp_path, result("old", [True]))
    record_stage(tmp_path, result("sft", [True, False]))
    record_stage(tmp_path, result("rl", [True, True]))
    old, sft, rl = read_rows(tmp_path)
    rows = [replace(old, environment=None), sft, replace(rl, environment={**(rl.environment or {}), "torch": "0.0"})]
    notes = [line for line in render_markdown(rows).splitlines() if "measured with" in line]

    assert len(notes) == 2
    assert notes[0].startswith("- sft: measured with ") and notes[1].startswith("- rl: measured with ")
    assert "torch 0.0" in notes[1]
