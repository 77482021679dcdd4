"""What the local runtime shares so this interpreter runs inside sandboxes."""

from __future__ import annotations

import sys
from pathlib import Path

import orchard
from orchard.sandbox.local.interpreter import interpreter_paths


def covered(path: Path, paths: list[Path]) -> bool:
    """Whether ``path`` lies under one of ``paths``."""
    return any(path.resolve().is_relative_to(p) for p in paths)


def test_interpreter_paths_cover_the_installation_the_virtualenv_and_orchard_outermost_only() -> None:
    paths = interpreter_paths()
    assert covered(Path(sys.base_prefix), paths)
    assert covered(Path(sys.prefix), paths)
    assert covered(Path(sys.executable), paths)
    assert covered(Path(orchard.__file__).parent, paths)
    assert all(p.is_absolute() and p == p.resolve() for p in paths)
    assert not any(a != b and a.is_relative_to(b) for a in paths for b in paths)


def test_a_package_that_is_not_installed_is_skipped() -> None:
    assert interpreter_paths(["no_such_package_for_orchard"]) == interpreter_paths([])
