"""``orchard replay``: re-run consumers over a range of recorded topics into a separate namespace."""

from __future__ import annotations

import os
import sys

import typer
from rich.table import Table

from orchard.cli.common import console, state
from orchard.cli.tail import parse_time


def replay(
    ctx: typer.Context,
    consumers: list[str] = typer.Argument(
        ...,
        help="Consumers to run, in order (built-in names, reward names, module:attr); later ones read the "
        "namespaced output of earlier ones.",
    ),
    namespace: str = typer.Option(..., "--namespace", "-n", help="Output topics are <namespace>.<topic>."),
    source: str | None = typer.Option(
        None, "--source", help="Read the recorded topics from <source>.<topic> instead of the standard ones."
    ),
    from_time: str | None = typer.Option(None, "--from-time", help="Range start: ISO 8601, epoch ms, or -10m."),
    to_time: str | None = typer.Option(None, "--to-time", help="Range end (exclusive): ISO 8601, epoch ms, or -10m."),
    from_offset: int | None = typer.Option(None, "--from-offset", min=0, help="Range start offset, every partition."),
    to_offset: int | None = typer.Option(None, "--to-offset", min=0, help="Range end offset (exclusive)."),
    drain_s: float = typer.Option(
        86_400, "--drain-s", min=0, help="At the end, flush what waits for more input as if this much time passed."
    ),
) -> None:
    """Replay consumers over a time or offset range of the recorded topics; the originals are never written."""
    from consumers.replay import ReplayRange
    from consumers.replay import replay as run_replay

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `module:attr` of the current directory is importable
    span = ReplayRange(
        from_time_ms=parse_time(from_time) if from_time else None,
        to_time_ms=parse_time(to_time) if to_time else None,
        from_offset=from_offset,
        to_offset=to_offset,
    )
    cli = state(ctx)
    config = cli.config()
    bus = cli.bus()
    try:
        reports = run_replay(
            bus, consumers, namespace, span, config=config.consumers, source=source, drain_ms=int(drain_s * 1000)
        )
    finally:
        bus.close()
    table = Table("consumer", "read", "records in", "records out", "dead letters")
    for report in reports:
        read = ", ".join(sorted(report.inputs.values()))
        s = report.stats
        table.add_row(report.consumer, read, str(s.records_in), str(s.outputs - s.dead_letters), str(s.dead_letters))
    console.print(table)
    written = sorted({t for r in reports for t in r.stats.by_topic})
    console.print(f"[green]replayed[/] into {', '.join(written) or f'{namespace}.* (nothing emitted)'}")
