"""Which host directories a sandbox must see for this process's Python to run in it.

Python harnesses (the built-in agent, mini-swe-agent) run inside a sandbox with ``sys.executable``, the runtime's
own interpreter, which on a typical machine is a virtualenv (``.venv`` of the checkout, possibly under ``/tmp``)
whose base interpreter lives somewhere the sandbox's unprivileged uid cannot reach (pyenv under ``/root``, mode
0700). ``interpreter_paths`` names the directories that interpreter needs: its installation (``sys.base_prefix``),
the virtualenv (``sys.prefix``) and the source directories of editable-installed packages it must import (Orchard
itself). The local runtime shares them read-only (``LocalRuntime(share_interpreter=True)``), masking whatever
untraversable directory lies above them so that nothing else there becomes visible.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

DEFAULT_PACKAGES = ("orchard", "minisweagent")
"""Packages Python harnesses import from this process's installation: the built-in agent is ``orchard``, and
mini-swe-agent (usually in the virtualenv already; its own directory counts where it is installed elsewhere)."""


def interpreter_paths(packages: Sequence[str] = DEFAULT_PACKAGES) -> list[Path]:
    """Canonical directories this interpreter needs in order to start and import ``packages``, outermost only.

    ``sys.base_prefix``/``base_exec_prefix`` (the standard library, ``libpython``), ``sys.prefix``/``exec_prefix``
    (the virtualenv and its ``site-packages``), the directory ``sys.executable`` resolves into, and the directory of
    each package in ``packages`` (an editable install keeps it in the source checkout, outside the virtualenv).
    A package that cannot be found is skipped: the harness that needs it fails with Python's own import error.
    """
    found = {
        Path(sys.base_prefix),
        Path(sys.base_exec_prefix),
        Path(sys.prefix),
        Path(sys.exec_prefix),
        Path(sys.executable).resolve().parent,
    }
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None:
            continue
        if spec.submodule_search_locations:
            found.update(Path(location) for location in spec.submodule_search_locations)
        elif spec.origin:
            found.add(Path(spec.origin).parent)
    resolved = {path.resolve() for path in found if path.is_dir()}
    return sorted(p for p in resolved if not any(p != other and p.is_relative_to(other) for other in resolved))
