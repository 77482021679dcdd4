"""A recipe command's options from a settings model: one ``--field-name`` per field, and the model from those given.

The task generators and setup stages of the recipes each take their generator's settings (``LookupConfig``,
``ClawConfig``, ``SuiteConfig``) as options; the model stays the one place that names them, types them and says what
they mean. An option left out is left out of the model too, so the model's own default (and its validation) apply.
"""

from __future__ import annotations

import argparse
from typing import TypeVar

from pydantic import BaseModel

ModelT = TypeVar("ModelT", bound=BaseModel)


def add_model_options(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """An option ``--field-name`` per field of ``model``: typed as its default is, its help the field's description,
    no default of its own (``model_from_options`` leaves an option not given to the model). Fields are plain ``int``,
    ``float`` or ``str`` settings; any other kind is refused here rather than parsed wrongly."""
    for name, field in model.model_fields.items():
        kind = type(field.default)
        if kind not in (int, float, str):
            raise TypeError(f"{model.__name__}.{name}: only int, float and str settings become options, not {kind}")
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, help=field.description)


def model_from_options(args: argparse.Namespace, model: type[ModelT]) -> ModelT:
    """``model`` from the options ``add_model_options`` added: those given, the model's defaults for the others."""
    return model(**{name: getattr(args, name) for name in model.model_fields if getattr(args, name) is not None})
