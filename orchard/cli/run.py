"""``orchard run RECIPE.yaml``: every component of a recipe as a supervised process, in one run directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer
import yaml

from orchard.cli.common import console, err_console
from orchard.config import OrchardConfig
from orchard.logging import configure_logging
from orchard.run.config import RunConfig, load_run_config
from orchard.run.exceptions import RunError
from orchard.run.rundir import RunDir, default_run_dir, public_dump, resolve_orchard_config, secret_environment


def run(
    recipe: Path | None = typer.Argument(None, exists=True, dir_okay=False, help="Recipe YAML (see orchard/run/)."),
    run_dir: Path | None = typer.Option(
        None, "--run-dir", file_okay=False, help="Run directory (default: .orchard/runs/<recipe>-<time>)."
    ),
    resume: Path | None = typer.Option(
        None, "--resume", exists=True, file_okay=False, help="Continue the run in this directory (same bus/store)."
    ),
    settings: Path | None = typer.Option(
        None, "--settings", exists=True, dir_okay=False, help="YAML whose bus/store sections replace the recipe's."
    ),
    no_live: bool = typer.Option(False, "--no-live", help="Structured log lines instead of the live table."),
    duration: float | None = typer.Option(None, "--duration", min=0.1, help="Stop cleanly after this many seconds."),
) -> None:
    """Start a recipe's components (engine, proxy, Env, consumers, trainers) and supervise them until Ctrl-C."""
    from orchard.run.live import BusMetrics, LiveView, LogView
    from orchard.run.supervisor import Supervisor, install_signal_handlers

    directory, config, previous_starts = _prepare(recipe, run_dir, resume)
    orchard_config = resolve_orchard_config(config, directory.root, settings)
    _check_same_backends(directory, orchard_config, resumed=resume is not None)
    _write_run_files(directory, config, orchard_config, recipe_given=recipe is not None)
    configure_logging(orchard_config.log_format, orchard_config.log_level)
    if config.create_topics:
        _create_standard_topics(orchard_config)

    env = {**os.environ, **secret_environment(orchard_config, directory), "PYTHONUNBUFFERED": "1",
           "ORCHARD_CONFIG": str(directory.orchard_config.resolve())}  # fmt: skip
    supervisor = Supervisor(config, directory, env, cwd=os.getcwd(), resumed=previous_starts,
                            bus=orchard_config.bus, run_id=orchard_config.run_id)  # fmt: skip
    install_signal_handlers(supervisor.request_stop)
    metrics = BusMetrics(orchard_config)
    view = LogView(metrics) if no_live else LiveView(metrics, console=console)
    with view:
        outcome = supervisor.run(view, duration_s=duration)
    colour = {"failed": "red", "completed": "green"}.get(outcome, "yellow")
    err_console.print(f"[{colour}]{outcome}[/] ({supervisor.reason}); run directory {directory.root}")
    err_console.print(f"resume with: orchard run --resume {directory.root}")
    if outcome == "failed":
        raise typer.Exit(1)


def _prepare(recipe: Path | None, run_dir: Path | None, resume: Path | None) -> tuple[RunDir, RunConfig, int]:
    """The run directory, the validated recipe, and how many times the run was started before."""
    from orchard.run.supervisor import ensure_not_running

    if resume is not None and run_dir is not None:
        raise RunError("give --run-dir for a new run or --resume for an existing one, not both")
    if resume is not None:
        directory = RunDir(resume)
        source = recipe or directory.recipe
        if not source.exists():
            raise RunError(f"{resume} is not a run directory: it has no {directory.recipe.name}")
        return directory, load_run_config(source), ensure_not_running(directory)
    if recipe is None:
        raise RunError("give a RECIPE to start a run, or --resume RUN_DIR to continue one")
    directory = RunDir(run_dir or default_run_dir(recipe))
    if directory.state.exists():
        raise RunError(f"{directory.root} already holds a run; continue it with --resume {directory.root}")
    config = load_run_config(recipe)
    (directory.root / "logs").mkdir(parents=True, exist_ok=True)
    return directory, config, 0


def _check_same_backends(directory: RunDir, config: OrchardConfig, *, resumed: bool) -> None:
    """A resumed run must read and write the bus and store it used before."""
    if not resumed or not directory.orchard_config.exists():
        return
    before = yaml.safe_load(directory.orchard_config.read_text()) or {}
    now = public_dump(config)
    for section in ("bus", "store", "run_id"):
        if before.get(section) != now.get(section):
            raise RunError(
                f"{section}: the resumed run used {before.get(section)!r}, these settings give {now.get(section)!r}"
            )


def _write_run_files(
    directory: RunDir, config: RunConfig, orchard_config: OrchardConfig, *, recipe_given: bool
) -> None:
    """The resolved config next to the run, and the recipe it runs (paths absolute, secrets left out)."""
    directory.orchard_config.write_text(yaml.safe_dump(public_dump(orchard_config), sort_keys=False))
    if recipe_given or not directory.recipe.exists():
        data: dict[str, Any] = config.model_dump(mode="json", exclude_none=True)
        if isinstance(data.get("store"), dict):
            for key in ("access_key", "secret_key"):
                data["store"].pop(key, None)
        directory.recipe.write_text(yaml.safe_dump(data, sort_keys=False))


def _create_standard_topics(config: OrchardConfig) -> None:
    """What ``orchard topics create`` does: the standard topics, keeping those that exist."""
    from orchard.bus import open_bus
    from orchard.topics import STANDARD_TOPICS

    bus = open_bus(config.bus)
    try:
        for spec in STANDARD_TOPICS:
            bus.create_topic(spec.name, spec.partitions, spec.config, exist_ok=True)
    finally:
        bus.close()
