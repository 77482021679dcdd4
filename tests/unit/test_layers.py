"""The layers hold: every import in ``orchard/``, ``producers/``, ``consumers/`` and ``trainers/`` points down or
sideways, never up.

From the bottom: the core (``orchard/`` but its entry points); ``producers/``, ``consumers/``, ``trainers/`` and
``recipes/``, each on the core alone; the entry points (``orchard.cli``, ``orchard.run``, ``orchard.viewer``), which may
import anything.
Inside the core, the harness adapters sit below Orchard Env: ``orchard.env`` runs them, they import nothing of it nor
of the runtimes behind the sandbox interface; the sandbox (``orchard.sandbox``) imports nothing of ``orchard.env``.
Every import counts, at module level or inside a function or ``if TYPE_CHECKING:``; relative imports are resolved;
a ``"package.module:attribute"`` string (a name imported later, by ``importlib``) counts as an import of its module.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WALKED = ("orchard", "producers", "consumers", "trainers")
ENTRY_POINTS = ("orchard.cli", "orchard.run", "orchard.viewer")
LAYERS = ("core", "producers", "consumers", "trainers", "recipes", "entry points")
MAY_IMPORT = {
    "core": {"core"},
    "producers": {"core", "producers"},
    "consumers": {"core", "consumers"},
    "trainers": {"core", "trainers"},
    "entry points": set(LAYERS),
}
"""The layers each layer's modules may import (besides third-party packages)."""
LAZY_IMPORT = re.compile(r"(?P<module>[A-Za-z_]\w*(?:\.\w+)*):[A-Za-z_]\w*")
"""A ``module:attribute`` string: what entry points and lazy registries import by name."""
HARNESSES_MAY_NOT_IMPORT = ("orchard.env", "orchard.sandbox.local", "orchard.sandbox.kubernetes")
"""The episode service that runs the harness adapters, and the runtimes behind the sandbox interface they use."""


@dataclass(frozen=True)
class Import:
    """One imported name: where the import is, and the module path it names (``a.b`` for ``from a import b``)."""

    where: str
    importer: str
    imported: str
    statement: str

    def __str__(self) -> str:
        return f"{self.where}: {self.statement} ({layer_of(self.importer)} -> {layer_of(self.imported)})"


def within(module: str, package: str) -> bool:
    """``module`` is ``package`` or inside it."""
    return module == package or module.startswith(package + ".")


def layer_of(module: str) -> str:
    """The layer of a dotted module path; a third-party module is its own top-level name."""
    if within(module, "orchard"):
        return "entry points" if any(within(module, entry) for entry in ENTRY_POINTS) else "core"
    return module.split(".")[0]


def module_name(path: Path, root: Path) -> tuple[str, list[str]]:
    """The dotted name of the module at ``path`` and the package its relative imports start from."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), parts
    return ".".join(parts), parts[:-1]


def imports_of(path: Path, root: Path) -> Iterator[Import]:
    """Every name the module at ``path`` imports, wherever the import statement is."""
    importer, package = module_name(path, root)
    where = path.relative_to(root).as_posix()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names = [module if alias.name == "*" else f"{module}.{alias.name}".lstrip(".") for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and LAZY_IMPORT.fullmatch(node.value):
            names = [node.value.partition(":")[0]]
        else:
            continue
        for name in names:
            yield Import(f"{where}:{node.lineno}", importer, name, ast.unparse(node))


@functools.cache
def all_imports(root: Path = ROOT) -> tuple[Import, ...]:
    """The imports of every module under the walked packages of ``root`` (read once per root)."""
    paths = sorted(path for top in WALKED for path in (root / top).rglob("*.py"))
    return tuple(found for path in paths for found in imports_of(path, root))


def climbing(imports: Iterable[Import]) -> list[str]:
    """The imports of a layer's module that name a layer it may not import."""
    lines = [
        str(found)
        for found in imports
        if layer_of(found.imported) in LAYERS and layer_of(found.imported) not in MAY_IMPORT[layer_of(found.importer)]
    ]
    return list(dict.fromkeys(lines))  # one line per statement, not per imported name


def test_the_core_imports_nothing_of_the_layers_above_it_nor_of_the_entry_points() -> None:
    assert climbing([found for found in all_imports() if layer_of(found.importer) == "core"]) == []


def test_producers_consumers_and_trainers_import_only_the_core_and_themselves() -> None:
    upper = ("producers", "consumers", "trainers")
    assert climbing([found for found in all_imports() if layer_of(found.importer) in upper]) == []


def test_the_harness_adapters_import_nothing_of_orchard_env_which_runs_them() -> None:
    harnesses = [f for f in all_imports() if within(f.importer, "orchard.harnesses")]
    above = [f for f in harnesses if any(within(f.imported, package) for package in HARNESSES_MAY_NOT_IMPORT)]
    assert [f"{f.where}: {f.statement}" for f in above] == []
    runner = [f.imported for f in all_imports() if f.importer == "orchard.env.episode_runner"]
    assert any(within(name, "orchard.harnesses") for name in runner)  # the legal direction, still in use


def test_the_sandbox_imports_nothing_of_the_episode_service_which_runs_on_it() -> None:
    sandbox = [f for f in all_imports() if within(f.importer, "orchard.sandbox")]
    assert [f"{f.where}: {f.statement}" for f in sandbox if within(f.imported, "orchard.env")] == []


def test_imports_inside_functions_and_relative_imports_that_climb_are_found(tmp_path: Path) -> None:
    files = {
        "orchard/__init__.py": "",
        "orchard/config.py": "from .bus import open_bus\n\ndef load():\n    from consumers.config import Settings\n",
        "orchard/bus/__init__.py": "from ..cli import main\nfrom . import base\n",
        "orchard/cli/__init__.py": "import trainers.policy\n",
        "orchard/registry.py": "ADAPTERS = {'claw': 'recipes.claw.harness:ClawAdapter', 'note': 'see: here'}\n",
        "producers/__init__.py": "",
        "producers/proxy.py": "if TYPE_CHECKING:\n    from consumers import assembler\n",
        "consumers/__init__.py": "",
        "trainers/__init__.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert climbing(all_imports(tmp_path)) == [
        "orchard/bus/__init__.py:1: from ..cli import main (core -> entry points)",
        "orchard/config.py:4: from consumers.config import Settings (core -> consumers)",
        "orchard/registry.py:1: 'recipes.claw.harness:ClawAdapter' (core -> recipes)",
        "producers/proxy.py:2: from consumers import assembler (producers -> consumers)",
    ]
