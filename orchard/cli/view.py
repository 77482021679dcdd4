"""``orchard view RUN_DIR``: serve the trajectory viewer of a run (``orchard.viewer``) until Ctrl-C."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import typer

from orchard.cli.common import console, state
from orchard.exceptions import OrchardError


def view(
    ctx: typer.Context,
    run_dir: Path = typer.Argument(..., help="Run directory (its orchard.yaml names the bus and store)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8600, min=0, max=65535, help="Port to listen on (0: any free one)."),
    tokens: str = typer.Option(
        "auto", help="Completion tokens as 'tiny' text, as 'ids', or 'auto' (text when the recipe's model is tiny)."
    ),
    refresh: float = typer.Option(2.0, min=0.0, help="Read new records from the bus at most this often (seconds)."),
) -> None:
    """Serve a page of the run's episodes (filterable; each one turn by turn, token by token) and its curves."""
    import uvicorn

    from orchard.viewer import RunView, create_app
    from orchard.viewer.tokens import TokenMode

    if tokens not in ("auto", "tiny", "ids"):
        raise typer.BadParameter("--tokens is 'auto', 'tiny' or 'ids'")
    if not run_dir.is_dir():
        raise OrchardError(f"run directory {run_dir} does not exist")
    cli = state(ctx)
    if cli.config_path is None and (run_dir / "orchard.yaml").is_file():
        cli.config_path = run_dir / "orchard.yaml"
    run_view = RunView(run_dir.resolve(), cli.config(), tokens=cast(TokenMode, tokens), refresh_s=refresh)
    console.print(f"viewer of {run_dir} on http://{host}:{port}/")
    uvicorn.run(create_app(run_view), host=host, port=port, log_level="warning", ws="none")
