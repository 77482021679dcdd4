"""A recipe as layers: a base file, overlays merged over it, ``--set`` edits, and component templates.

``orchard run base.yaml --overlay small.yaml --set components.trainer.max_steps=10`` reads ``base.yaml``, merges each
overlay over it in order, then applies each ``--set``; what results is validated as one recipe, so an error names
the field exactly as it would in a single file. Merging is by key: a mapping in the overlay merges into the mapping
it replaces, anything else (a list, a scalar, ``null``) replaces the value whole. Relative paths in an overlay are
relative to the base recipe, like the base's own.

``--set PATH=VALUE``: ``PATH`` is dot-separated keys (a number indexes a list: ``stages.0.name``; a key holding a dot
cannot be set this way), ``VALUE`` is read as YAML (``10`` an int, ``[a, b]`` a list, ``null``, ``'10'`` a string).
Missing mappings on the way are created; indexing past a list's end, or into a scalar, is an error naming the path.

A component set to ``null`` (``components: {eval-rerank: null}`` in an overlay, or ``--set components.X=null``)
is removed: an overlay can trim a recipe to the stages it keeps. A stage that still names it fails validation, naming
the stage and the component.

Templates remove copies inside one recipe: a top-level ``templates:`` mapping holds named partial component specs,
and a component with ``template: NAME`` starts from that template with its own keys merged over it (a template may
name a ``template`` of its own; a cycle or an unknown name is an error naming the component). Lists are replaced whole
by a merge, so what varies inside one (a command's ``--stage X``, a trainer's ``max_steps=N``) is a parameter: the
template writes ``{param:NAME}`` in a string and the component gives ``params: {NAME: value}``. A parameter a template
uses and the component does not give, or one the component gives and no string uses, is an error naming both.
Templates are expanded after overlays and ``--set``, so an overlay can change a template and every component built
from it::

    templates:
      eval: {kind: command, after: [eval-env], restart: {policy: never},
             run: [orchard, eval, --stage, "{param:stage}", --run-dir, "{run_dir}"]}
    components:
      eval-sft: {template: eval, params: {stage: sft}}
      eval-rl: {template: eval, params: {stage: rl}}

``{run_id}`` is the one placeholder a recipe's strings can use that no component knows by itself: it is replaced by
the recipe's ``run_id`` in every string, once the layers are merged (a recipe that uses it must set ``run_id``).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from orchard.exceptions import ConfigError

TEMPLATES_KEY = "templates"
TEMPLATE_KEY = "template"
PARAMS_KEY = "params"
PARAM = re.compile(r"\{param:([A-Za-z0-9_-]+)\}")
RUN_ID_PLACEHOLDER = "{run_id}"


def merge(base: Any, overlay: Any) -> Any:
    """``overlay`` merged over ``base``: mappings key by key (recursively), anything else replaced whole."""
    if isinstance(base, Mapping) and isinstance(overlay, Mapping):
        merged = dict(base)
        for key, value in overlay.items():
            merged[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    return copy.deepcopy(overlay)


def apply_set(data: dict[str, Any], assignment: str) -> dict[str, Any]:
    """``data`` with one ``PATH=VALUE`` assignment applied (a new mapping; ``data`` is left as it was)."""
    path, equals, raw = assignment.partition("=")
    keys = path.strip().split(".")
    if not equals or not all(keys):
        raise ConfigError(f"--set {assignment!r}: expected PATH=VALUE, PATH dot-separated keys (e.g. a.b.c=1)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {assignment!r}: the value is not YAML: {exc}") from exc
    result = copy.deepcopy(data)
    node: Any = result
    for depth, key in enumerate(keys):
        where = ".".join(keys[: depth + 1])
        last = depth == len(keys) - 1
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise ConfigError(f"--set {assignment!r}: {where} is not an index of a list of {len(node)}")
            if last:
                node[int(key)] = value
            else:
                node = node[int(key)]
        elif isinstance(node, dict):
            if last:
                node[key] = value
            else:
                if node.get(key) is None:  # a mapping on the way that is not there yet
                    node[key] = {}
                node = node[key]
        else:
            parent = ".".join(keys[:depth])
            raise ConfigError(f"--set {assignment!r}: {parent} is a {type(node).__name__}, not a mapping")
    return result


def expand_templates(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with its ``templates`` removed and every component's ``template`` replaced by what it names."""
    templates = data.get(TEMPLATES_KEY) or {}
    if not isinstance(templates, dict):
        raise ConfigError(f"{TEMPLATES_KEY}: must be a mapping of template names to partial component specs")
    result = {key: value for key, value in data.items() if key != TEMPLATES_KEY}
    components = result.get("components")
    if not isinstance(components, dict):
        return result
    result["components"] = {
        name: _with_params(_expanded(spec, templates, f"components.{name}"), f"components.{name}")
        if isinstance(spec, dict)
        else spec
        for name, spec in components.items()
    }
    return result


def _with_params(spec: dict[str, Any], where: str) -> dict[str, Any]:
    """``spec`` without its ``params``, every ``{param:NAME}`` in its strings replaced by the value given."""
    params = spec.get(PARAMS_KEY) or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{where}.{PARAMS_KEY}: must be a mapping of parameter names to values")
    body = {key: value for key, value in spec.items() if key != PARAMS_KEY}
    used: set[str] = set()

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            names = PARAM.findall(value)
            used.update(names)
            missing = [name for name in names if name not in params]
            if missing:
                raise ConfigError(f"{where}: uses {{param:{missing[0]}}} but its params give no {missing[0]!r}")
            return PARAM.sub(lambda match: str(params[match.group(1)]), value)
        if isinstance(value, dict):
            return {key: fill(item) for key, item in value.items()}
        if isinstance(value, list):
            return [fill(item) for item in value]
        return value

    filled = fill(body)
    unused = sorted(set(params) - used)
    if unused:
        raise ConfigError(f"{where}.{PARAMS_KEY}: {', '.join(unused)} used by no {{param:...}} of its template")
    return filled


def _expanded(spec: dict[str, Any], templates: Mapping[str, Any], where: str, seen: tuple[str, ...] = ()) -> Any:
    name = spec.get(TEMPLATE_KEY)
    if name is None:
        return spec
    if not isinstance(name, str) or name not in templates:
        known = ", ".join(sorted(templates)) or "none"
        raise ConfigError(f"{where}.{TEMPLATE_KEY}: no template {name!r} (known: {known})")
    if name in seen:
        raise ConfigError(f"{where}.{TEMPLATE_KEY}: templates name each other in a cycle: {' -> '.join((*seen, name))}")
    template = templates[name]
    if not isinstance(template, dict):
        raise ConfigError(f"{TEMPLATES_KEY}.{name}: must be a mapping (a partial component spec)")
    own = {key: value for key, value in spec.items() if key != TEMPLATE_KEY}
    return merge(_expanded(template, templates, f"{TEMPLATES_KEY}.{name}", (*seen, name)), own)


def _without_removed_components(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without the components a layer set to ``null`` (a component spec is never null otherwise)."""
    components = data.get("components")
    if not isinstance(components, dict) or all(spec is not None for spec in components.values()):
        return data
    return {**data, "components": {name: spec for name, spec in components.items() if spec is not None}}


def replace_run_id(data: Any, run_id: str) -> Any:
    """Every string in ``data`` with ``{run_id}`` replaced by ``run_id``."""
    return replace_in_strings(data, RUN_ID_PLACEHOLDER, run_id)


def replace_in_strings(data: Any, placeholder: str, value: str) -> Any:
    """``data`` with ``placeholder`` replaced by ``value`` in every string of it (mappings and lists copied)."""
    if isinstance(data, str):
        return data.replace(placeholder, value)
    if isinstance(data, dict):
        return {key: replace_in_strings(item, placeholder, value) for key, item in data.items()}
    if isinstance(data, list):
        return [replace_in_strings(item, placeholder, value) for item in data]
    return data


def read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """The mapping at the top of the YAML file ``path`` (``what`` names it in errors)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} must be a mapping at the top level")
    return data


def layered_recipe(path: Path, overlays: Sequence[Path] = (), sets: Sequence[str] = ()) -> dict[str, Any]:
    """The recipe at ``path`` with ``overlays`` merged over it, ``sets`` applied, templates and ``{run_id}``
    expanded: one mapping, ready to validate."""
    data = read_yaml_mapping(path, "recipe")
    for overlay in overlays:
        data = merge(data, read_yaml_mapping(overlay, "overlay"))
    for assignment in sets:
        data = apply_set(data, assignment)
    data = expand_templates(_without_removed_components(data))
    run_id = data.get("run_id")
    if isinstance(run_id, str):
        return replace_run_id(data, run_id)
    if RUN_ID_PLACEHOLDER in yaml.safe_dump(data):
        raise ConfigError(f"recipe {path} uses {RUN_ID_PLACEHOLDER} but sets no run_id (set one, or --set run_id=NAME)")
    return data
