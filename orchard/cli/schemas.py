"""``orchard schemas check|list``."""

from __future__ import annotations

import typer
from rich.table import Table

from orchard.cli.common import console, err_console
from orchard.schema_catalog import SchemaCatalog
from orchard.schema_compat import check_catalog

app = typer.Typer(help="Inspect and check the Avro schema catalog.", no_args_is_help=True)


@app.command("check")
def check() -> None:
    """Fail unless every schema version is backward and forward compatible with the one before it."""
    catalog = SchemaCatalog.load()
    problems = check_catalog(catalog)
    for problem in problems:
        err_console.print(f"[red]incompatible:[/] {problem}")
    if problems:
        raise typer.Exit(1)
    console.print(f"[green]ok[/] {len(catalog.names())} schemas, every version compatible with the previous one")


@app.command("list")
def list_schemas() -> None:
    """List schemas with their versions and the current version's fingerprint."""
    catalog = SchemaCatalog.load()
    table = Table("schema", "versions", "current fingerprint")
    for name in catalog.names():
        current = catalog.current(name)
        versions = ", ".join(f"v{v.version}" for v in catalog.versions(name))
        table.add_row(name, versions, current.fingerprint_hex)
    console.print(table)
