"""``orchard consumer``: Stream consumers: run one as its own consumer group."""

from __future__ import annotations

import typer

app = typer.Typer(help="Stream consumers: run one as its own consumer group.", no_args_is_help=True)
