"""``orchard demo``: the event backbone end to end on the configured (by default embedded) bus and store."""

from __future__ import annotations

import typer
from rich.table import Table

from orchard.cli.backbone_demo import run_demo
from orchard.cli.common import console, state


def demo(
    ctx: typer.Context,
    calls: int = typer.Option(30, "--calls", min=1, max=500, help="Model calls in the scripted episode."),
) -> None:
    """Record a scripted episode and a weight version, replay them, and verify everything came back exactly."""
    config = state(ctx).config()
    report = run_demo(config, calls=calls, console=console)
    table = Table(title=f"Orchard backbone demo — bus: {config.bus.type}, store: {config.store.type}")
    table.add_column("check")
    table.add_column("result", justify="right")
    table.add_row("episode", report.episode_id)
    table.add_row("model calls recorded", str(report.calls))
    table.add_row("prompt tokens across calls", f"{report.prompt_tokens_total:,}")
    table.add_row("bytes on the bus (prefix delta)", f"{report.bytes_on_bus:,}")
    table.add_row("prompts + messages rebuilt token-exactly", f"{report.prompts_rebuilt}/{report.calls}")
    table.add_row("episode outcome", report.outcome_status)
    table.add_row("policy version published", f"v{report.policy_version}")
    table.add_row("weights downloaded, sha256 verified", "yes" if report.weights_verified else "NO")
    console.print(table)
