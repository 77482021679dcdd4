"""A setup stage's options read from the recipe it runs in: its ``tasks:`` and ``expert:`` blocks, not copies of them.

``orchard run`` writes the recipe it runs, overlays and ``--set`` applied and templates expanded, to
``RUN_DIR/recipe.yaml`` (``orchard.run.rundir.RunDir.recipe``). A setup module given ``--recipe RUN_DIR/recipe.yaml``
takes the defaults of its options from that file's blocks, so a recipe states each setting once, and an overlay or
``--set tasks.train_tasks=50`` reaches the setup stage. An option given on the command line still wins.

Each module says what it reads, block by block (``Block``): the keys that give an option's default (key -> the
option's destination), and the recorded keys it only checks (``generator: recipes.claw.tasks``: the module the
block describes must be the one running). Any other key is an error naming the key, its block and the file, and so
is a value of the wrong type. ``{recipe_dir}`` in a string is the recipe file's folder, and a relative path (an
option of type ``Path``) is relative to it: for ``RUN_DIR/recipe.yaml``, the run directory.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard.exceptions import ConfigError
from orchard.run.config import RECIPE_DIR, RUN_DIR
from orchard.run.recipe_layers import layered_recipe, replace_in_strings

RUN_RECIPE = "{run_dir}/recipe.yaml"
"""What a recipe's setup component passes as ``--recipe``: the copy of the recipe ``orchard run`` runs."""

_KINDS: dict[object, tuple[str, Callable[[Any], bool]]] = {
    bool: ("true or false", lambda value: isinstance(value, bool)),
    int: ("an integer", lambda value: isinstance(value, int) and not isinstance(value, bool)),
    float: ("a number", lambda value: isinstance(value, int | float) and not isinstance(value, bool)),
    str: ("a string", lambda value: isinstance(value, str)),
    Path: ("a path", lambda value: isinstance(value, str)),
}


@dataclass(frozen=True)
class Block:
    """What a setup module reads from one block of a recipe."""

    options: Mapping[str, str]
    """Block key -> the destination of the option whose default it gives."""
    recorded: Mapping[str, object] = field(default_factory=dict)
    """Keys read by nobody but checked: each must hold this value (the module that generates, or plans)."""
    nested: Collection[str] = ()
    """Keys holding a block of their own (``tasks.train``), read through their own entry, or not at all."""


def add_recipe_option(parser: argparse.ArgumentParser, blocks: str) -> None:
    """The ``--recipe PATH`` option; ``blocks`` names what it reads (``the tasks: and expert: blocks``)."""
    parser.add_argument(
        "--recipe",
        type=Path,
        metavar="PATH",
        help=f"A recipe whose {blocks} give the options' defaults (in a recipe: {RUN_RECIPE}, the run's own copy, "
        "overlays and --set applied); an option given here still wins.",
    )


def parse_with_recipe(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    blocks: Mapping[str, Block],
    top: Mapping[str, str] | None = None,
) -> argparse.Namespace:
    """``argv`` parsed; with ``--recipe PATH``, parsed again over the defaults PATH's ``blocks`` give (``top``: keys
    at the recipe's top level that give one too, e.g. ``harness``). A bad recipe exits 2, naming the key.

    Parsed as ``parse_intermixed_args`` does, so a positional a recipe can give (``nargs="?"``) may still be given
    between options."""
    args = parser.parse_intermixed_args(argv)
    if args.recipe is None:
        return args
    try:
        defaults = recipe_defaults(args.recipe, blocks, parser, top or {})
    except ConfigError as exc:
        parser.error(str(exc))
    parser.set_defaults(**defaults)
    return parser.parse_intermixed_args(argv)


def recipe_defaults(
    path: Path, blocks: Mapping[str, Block], parser: argparse.ArgumentParser, top: Mapping[str, str]
) -> dict[str, Any]:
    """Option destination -> default, from the blocks (dotted names: ``tasks``, ``tasks.train``) of the recipe at
    ``path``; ``ConfigError`` naming the key and the file for a key no block knows or a value of the wrong type."""
    data = layered_recipe(path)
    folder = Path(path).resolve().parent
    actions = {action.dest: action for action in parser._actions}
    defaults: dict[str, Any] = {}
    for name, block in blocks.items():
        for key, value in _block(data, name, path).items():
            where = f"recipe {path}: {name}.{key}"
            if key in block.nested:
                continue
            if key in block.recorded:
                if value != block.recorded[key]:
                    expected = block.recorded[key]
                    raise ConfigError(f"{where} is {value!r}, but for {parser.prog} it can only be {expected!r}")
                continue
            if key not in block.options:
                known = ", ".join(sorted([*block.options, *block.recorded, *block.nested]))
                raise ConfigError(f"{where}: {parser.prog} has no such setting (known: {known})")
            if RUN_DIR in str(value):  # the blocks are not run strings: relative paths are relative to the run already
                raise ConfigError(f"{where}: {RUN_DIR} is not filled in here; write the path relative to the run "
                                  f"directory instead (e.g. {str(value).replace(RUN_DIR + '/', '')!r})")  # fmt: skip
            dest = block.options[key]
            defaults[dest] = _checked(replace_in_strings(value, RECIPE_DIR, str(folder)), actions[dest], where, folder)
    for key, dest in top.items():
        if data.get(key) is not None:
            defaults[dest] = _checked(data[key], actions[dest], f"recipe {path}: {key}", folder)
    return defaults


def _block(data: Mapping[str, Any], name: str, path: Path) -> Mapping[str, Any]:
    """The mapping at the dotted ``name`` of ``data`` ({} when it is not there)."""
    node: Any = data
    for key in name.split("."):
        node = node.get(key) if isinstance(node, Mapping) else None
        if node is None:
            return {}
    if not isinstance(node, Mapping):
        raise ConfigError(f"recipe {path}: {name} must be a mapping of settings, not {node!r}")
    return node


def _checked(value: Any, action: argparse.Action, where: str, folder: Path) -> Any:
    """``value`` as the default of ``action``; ``ConfigError`` when it is not of the option's type or choices."""
    kind = bool if isinstance(action, argparse.BooleanOptionalAction) else action.type
    if kind in _KINDS:
        what, fits = _KINDS[kind]
        if not fits(value):
            raise ConfigError(f"{where}: {value!r} is not {what}")
    if action.choices is not None and value not in action.choices:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(str, action.choices))}")
    if kind is Path:
        return folder / value  # an absolute path stays what it is
    return float(value) if kind is float else value
