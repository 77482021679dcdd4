"""``orchard train``: Trainers: policy and value models."""

from __future__ import annotations

import typer

app = typer.Typer(help="Trainers: policy and value models.", no_args_is_help=True)
