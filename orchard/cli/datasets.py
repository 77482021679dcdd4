"""``orchard import`` and ``orchard export``: trajectory datasets in and out of the bus."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orchard.cli.common import console, err_console, state
from orchard.cli.tail import parse_time
from orchard.topics import DEAD_LETTERS, MODEL_CALLS, OUTCOMES, TOPICS_BY_NAME


@contextmanager
def _progress(description: str, total: int | None) -> Iterator[Callable[[], None]]:
    """A progress bar on stderr; yields the function that advances it by one row."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield lambda: progress.advance(task)


def import_(
    ctx: typer.Context,
    files: list[Path] = typer.Argument(..., help="Parquet (.parquet) or JSONL (.jsonl) files, one trajectory a row."),
    layout: str = typer.Option(
        ..., "--layout", "-l", help="orchard-swe | orchard-gui | swe-gym | swe-smith | orchard | custom."
    ),
    mappings: list[str] = typer.Option(
        [], "--map", "-m", help="SOURCE=FIELD: column (or column.key of a JSON column) of a field; repeatable."
    ),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", "-t", help="Policy tokenizer directory, or 'tiny'; not needed for --layout orchard."
    ),
    run_id: str | None = typer.Option(
        None, "--run-id", "-r", help="Run the episodes belong to (--layout orchard: default, each row's own)."
    ),
    limit: int | None = typer.Option(None, "--limit", "-n", min=1, help="Import at most this many rows."),
    policy_version: int = typer.Option(0, "--policy-version", min=0, help="Policy version recorded on the calls."),
) -> None:
    """Import trajectory datasets as ModelCall/EpisodeOutcome records (retokenized); bad rows are dead-lettered."""
    from orchard.datasets.conversation import ChatTokenizer
    from orchard.datasets.exceptions import DatasetError
    from orchard.datasets.importer import DatasetImporter
    from orchard.datasets.layouts import layout_with_overrides
    from orchard.datasets.sources import count_rows

    chosen = layout_with_overrides(layout, mappings)
    if chosen.kind != "orchard" and (tokenizer is None or run_id is None):
        raise DatasetError(f"--layout {layout} needs --tokenizer and --run-id")
    chat = ChatTokenizer.load(tokenizer) if tokenizer is not None and chosen.kind != "orchard" else None
    total = sum(count_rows(path) for path in files)
    total = min(total, limit) if limit is not None else total
    bus = state(ctx).bus()
    try:
        for name in (MODEL_CALLS, OUTCOMES, DEAD_LETTERS):
            spec = TOPICS_BY_NAME[name]
            bus.create_topic(name, spec.partitions, spec.config, exist_ok=True)
        producer = bus.producer()
        try:
            importer = DatasetImporter(producer, chosen, run_id=run_id, tokenizer=chat, policy_version=policy_version)
            with _progress("importing", total) as advance:
                stats = importer.import_files(files, limit=limit, on_row=advance)
        finally:
            producer.close()
    finally:
        bus.close()
    console.print(
        f"[green]imported[/] {stats.episodes} episodes ({stats.calls} calls, {stats.tokens} tokens) from "
        f"{stats.rows} rows in {stats.seconds:.1f}s ({stats.rows_per_s:.0f} rows/s); "
        f"{stats.dead_lettered} dead-lettered to {DEAD_LETTERS}" + (f" {stats.reasons}" if stats.reasons else ""),
        soft_wrap=True,
    )


def export(
    ctx: typer.Context,
    out: Path = typer.Argument(..., help="Output file."),
    run: str | None = typer.Option(None, "--run", "-r", help="Only this run's episodes (default: every run)."),
    fmt: str | None = typer.Option(None, "--format", "-f", help="parquet | jsonl (default: from OUT's suffix)."),
    from_ts: str | None = typer.Option(None, "--from-ts", help="Outcomes at or after: ISO 8601, epoch ms, or -2h."),
    to_ts: str | None = typer.Option(None, "--to-ts", help="Outcomes before this time."),
    from_offset: int | None = typer.Option(None, "--from-offset", min=0, help="First outcomes offset, per partition."),
    to_offset: int | None = typer.Option(None, "--to-offset", min=0, help="End outcomes offset (exclusive)."),
) -> None:
    """Export recorded episodes (messages, token ids, loss masks, logprobs, outcome) to Parquet or JSONL."""
    from orchard.datasets.exporter import ExportSelection, export_trajectories

    chosen = fmt or ("jsonl" if out.suffix.lower() in (".jsonl", ".json", ".ndjson") else "parquet")
    if chosen not in ("parquet", "jsonl"):
        raise typer.BadParameter(f"{chosen!r}: choose parquet or jsonl", param_hint="--format")
    selection = ExportSelection(
        run_id=run,
        from_ts=None if from_ts is None else parse_time(from_ts),
        to_ts=None if to_ts is None else parse_time(to_ts),
        from_offset=from_offset,
        to_offset=to_offset,
    )
    bus = state(ctx).bus()
    try:
        with _progress("exporting", None) as advance:
            stats = export_trajectories(bus, out, chosen, selection, on_episode=advance)  # type: ignore[arg-type]
    finally:
        bus.close()
    console.print(
        f"[green]exported[/] {stats.episodes} episodes ({stats.calls} calls) to {out} in {stats.seconds:.1f}s "
        f"({stats.rows_per_s:.0f} rows/s); {stats.incomplete} with missing calls, {stats.skipped} skipped",
        soft_wrap=True,
    )
