"""``orchard consumer run NAME | module:attr`` and ``orchard consumer list``."""

from __future__ import annotations

import os
import sys

import typer
from rich.table import Table

from orchard.cli.common import console, state

app = typer.Typer(help="Stream consumers: run one as its own consumer group.", no_args_is_help=True)


@app.command("run")
def run(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="A built-in (`orchard consumer list`), a registered reward, or module:attr."),
    group: str | None = typer.Option(None, "--group", "-g", help="Consumer group (default: the consumer's own)."),
    instance: str | None = typer.Option(
        None, "--instance", help="Instance id, unique in the group ($ORCHARD_INSTANCE_ID, else the host name)."
    ),
    namespace: str | None = typer.Option(
        None, "--namespace", "-n", help="Read and write <namespace>.<topic> instead of the standard topics."
    ),
    idle_exit: float | None = typer.Option(
        None, "--idle-exit", min=0.1, help="Exit after this many seconds without input (batch jobs, tests)."
    ),
    start: str | None = typer.Option(
        None,
        "--start",
        help="Where a new group (no committed offsets) starts: earliest, latest, stage (the run stage's start, "
        "$ORCHARD_STAGE_STARTED_MS), a time in ms since the epoch or ISO 8601 (default: consumers.runtime.start).",
    ),
) -> None:
    """Run one consumer until SIGTERM/SIGINT: exactly-once, state in a changelog topic, bad records dead-lettered."""
    from consumers.builtin import build_processor
    from consumers.runtime import ConsumerRuntime, stop_on_signals
    from consumers.start import parse_start, resolve_start

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like uvicorn: `module:attr` of the current directory is importable
    cli = state(ctx)
    config = cli.config()
    processor = build_processor(name, config.consumers)
    position = resolve_start(parse_start(start) if start else config.consumers.runtime.start, os.environ)
    bus = cli.bus()
    try:
        runtime = ConsumerRuntime(
            bus, processor, config=config.consumers.runtime, group=group, instance_id=instance, namespace=namespace,
            start=position,
        )  # fmt: skip
        with stop_on_signals(runtime):
            stats = runtime.run(idle_exit_s=idle_exit)
        console.print(
            f"[green]stopped[/] {runtime.group}: {stats.records_in} records in, {stats.outputs} out, "
            f"{stats.dead_letters} dead-lettered"
        )
    finally:
        bus.close()


@app.command("list")
def list_consumers() -> None:
    """List the runnable consumer names: built-in processors and registered reward plug-ins."""
    from consumers.builtin import available

    table = Table("name", "what it does")
    for name, description in available().items():
        table.add_row(name, description)
    console.print(table)
    console.print("Any `package.module:attribute` (a RewardPlugin, a scoring function or a Processor) runs too.")
