"""``orchard topics create|list|describe``."""

from __future__ import annotations

import typer
from rich.table import Table

from orchard.bus import TopicExistsError
from orchard.cli.common import console, state
from orchard.topics import STANDARD_TOPICS, TOPICS_BY_NAME

app = typer.Typer(help="Create, list and describe topics.", no_args_is_help=True)


@app.command("create")
def create(
    ctx: typer.Context,
    names: list[str] = typer.Argument(None, help="Topics to create; none: every standard Orchard topic."),
    partitions: int | None = typer.Option(None, "--partitions", "-p", min=1, help="Partitions (default: bus's)."),
    exist_ok: bool = typer.Option(False, "--exist-ok", help="Do not fail when a named topic exists."),
) -> None:
    """Create topics; without names, create Orchard's standard topics (existing ones are kept)."""
    bus = state(ctx).bus()
    try:
        if not names:
            for spec in STANDARD_TOPICS:
                bus.create_topic(spec.name, partitions or spec.partitions, spec.config, exist_ok=True)
                console.print(f"[green]ok[/] {spec.name}")
            return
        for name in names:
            spec = TOPICS_BY_NAME.get(name)
            default_partitions = spec.partitions if spec else None
            bus.create_topic(name, partitions or default_partitions, spec.config if spec else None, exist_ok=exist_ok)
            console.print(f"[green]created[/] {name}")
    except TopicExistsError as exc:
        console.print(f"[red]error:[/] {exc} (use --exist-ok to accept it)")
        raise typer.Exit(1) from exc
    finally:
        bus.close()


@app.command("list")
def list_topics(ctx: typer.Context) -> None:
    """List topics with partitions, records held, and the schema of standard ones."""
    bus = state(ctx).bus()
    try:
        table = Table("topic", "partitions", "records", "schema")
        for name in bus.list_topics():
            info = bus.describe_topic(name)
            spec = TOPICS_BY_NAME.get(name)
            table.add_row(name, str(info.partitions), str(info.record_count), spec.schema if spec else "-")
        console.print(table)
    finally:
        bus.close()


@app.command("describe")
def describe(ctx: typer.Context, name: str = typer.Argument(..., help="Topic name.")) -> None:
    """Show each partition's first and next offset."""
    bus = state(ctx).bus()
    try:
        info = bus.describe_topic(name)
        spec = TOPICS_BY_NAME.get(name)
        console.print(f"[bold]{name}[/]  partitions={info.partitions}  schema={spec.schema if spec else '-'}")
        table = Table("partition", "start offset", "end offset", "records")
        for p in range(info.partitions):
            start, end = info.start_offsets.get(p, 0), info.end_offsets.get(p, 0)
            table.add_row(str(p), str(start), str(end), str(end - start))
        console.print(table)
    finally:
        bus.close()
