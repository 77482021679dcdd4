"""``orchard engine serve`` turns its options into the engine's config (the server itself is not started here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard.cli.main import app
from orchard.engines.config import EngineConfig


def served_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *options: str) -> EngineConfig:
    """The ``EngineConfig`` that ``engine serve`` with ``options`` hands to the server."""
    seen: list[EngineConfig] = []
    monkeypatch.setattr("orchard.engines.server.serve_engine", lambda engine, config: seen.append(engine))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["engine", "serve", "--model", "tiny-llama", *options], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return seen[0]


def test_cpu_threads_reach_the_engine_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert served_config(monkeypatch, tmp_path, "--cpu-threads", "1").cpu_threads == 1


def test_without_cpu_threads_the_engine_keeps_torchs_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert served_config(monkeypatch, tmp_path).cpu_threads is None
