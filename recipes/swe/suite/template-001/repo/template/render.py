"""Rendering placeholders."""

import re
from collections.abc import Mapping
from typing import Any

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][\w.]*)\s*\}\}")


class MissingVariable(KeyError):
    """A placeholder names a variable absent from the context."""


def variables(template: str) -> list[str]:
    """Placeholder names in order of first appearance."""
    return list(dict.fromkeys(_PLACEHOLDER.findall(template)))


def _lookup(context: Mapping[str, Any], dotted: str) -> Any:
    value: Any = context
    for part in dotted.split("."):
        try:
            value = value[part]
        except (KeyError, TypeError):
            raise MissingVariable(dotted) from None
    return value


def render(template: str, context: Mapping[str, Any]) -> str:
    """Replace every ``{{ name }}`` with its value from ``context``, inserted verbatim."""
    result = template
    for name in variables(template):
        pattern = r"\{\{\s*" + re.escape(name) + r"\s*\}\}"
        result = re.sub(pattern, str(_lookup(context, name)), result)
    return result
