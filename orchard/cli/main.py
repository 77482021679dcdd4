"""The ``orchard`` command: one entry point, a subcommand per concept."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from orchard import __version__
from orchard.cli import (
    consumer,
    datasets,
    demo,
    export_model,
    replay,
    rollout,
    schemas,
    serve,
    tail,
    topics,
    track,
    train,
    train_value,
    view,
)
from orchard.cli import run as run_command  # `run` is also this module's entry-point function
from orchard.cli.common import CliState, err_console
from orchard.exceptions import OrchardError

app = typer.Typer(
    help="Orchard: train LLM agents with RL inside the harness they are deployed in.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(topics.app, name="topics")
app.add_typer(schemas.app, name="schemas")
app.command("tail")(tail.tail)
app.command("demo")(demo.demo)
app.add_typer(serve.engine_app, name="engine")
app.add_typer(serve.proxy_app, name="proxy")
app.add_typer(serve.env_app, name="env")
app.add_typer(consumer.app, name="consumer")
app.command("replay")(replay.replay)
app.add_typer(train.app, name="train")
app.command("eval")(train_value.eval_rerank)
app.command("import")(datasets.import_)
app.command("export")(datasets.export)
app.command("export-model")(export_model.export_model)
app.command("run")(run_command.run)
app.add_typer(rollout.app, name="rollout")
app.command("view")(view.view)
app.command("track")(track.track)


@app.callback()
def main(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None, "--config", "-c", envvar="ORCHARD_CONFIG", help="YAML config; ORCHARD_* variables override it."
    ),
) -> None:
    """Global options."""
    ctx.obj = CliState(config_path=config)


@app.command("version")
def version() -> None:
    """Print Orchard's version."""
    typer.echo(__version__)


def run() -> None:
    """Console-script entry point: Orchard's own errors become one clear line and exit code 1."""
    try:
        app()
    except OrchardError as exc:
        err_console.print(f"[red]error:[/] {exc}")
        sys.exit(1)
