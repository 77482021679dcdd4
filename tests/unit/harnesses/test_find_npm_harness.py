"""Finding an npm-installed harness: the variable, the project-local install, PATH, or an error that says how."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.harnesses.base import HarnessNotInstalledError, find_npm_harness


def test_the_variable_wins_then_a_missing_harness_names_its_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCHARD_TEST_HARNESS_BIN", "/opt/h/bin/h")
    missing = Path("no/such/install/h")
    assert find_npm_harness("h", "ORCHARD_TEST_HARNESS_BIN", missing, "h (npm h@1)") == "/opt/h/bin/h"
    monkeypatch.delenv("ORCHARD_TEST_HARNESS_BIN")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HarnessNotInstalledError, match=r"h \(npm h@1\) not found: .*ORCHARD_TEST_HARNESS_BIN"):
        find_npm_harness("h-not-on-path", "ORCHARD_TEST_HARNESS_BIN", missing, "h (npm h@1)")
    (tmp_path / "no/such/install").mkdir(parents=True)
    (tmp_path / "no/such/install/h").write_text("")
    assert find_npm_harness("h", "ORCHARD_TEST_HARNESS_BIN", missing, "h (npm h@1)") == str(tmp_path / missing)
