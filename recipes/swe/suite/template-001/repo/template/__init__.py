"""Mini templates."""

from template.render import MissingVariable, render, variables

__all__ = ["MissingVariable", "render", "variables"]
