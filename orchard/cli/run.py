"""``orchard run RECIPE.yaml``: every component of a recipe as a supervised process, in one run directory."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
import yaml
from rich.markup import escape

from orchard.cli.common import console
from orchard.config import OrchardConfig
from orchard.logging import configure_logging
from orchard.run.config import RunConfig, load_run_config
from orchard.run.exceptions import RunError
from orchard.run.preflight import check_components
from orchard.run.rundir import RunDir, default_run_dir, public_dump, resolve_orchard_config, secret_environment

if TYPE_CHECKING:
    from orchard.run.live import BusMetrics, LiveView, LogView
    from orchard.run.plain import PlainView
    from orchard.run.supervisor import ComponentState, Supervisor

    RunScreen = LiveView | LogView | PlainView

SIGNAL_EXIT_BASE = 128


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
    overlay: list[Path] = typer.Option(  # noqa: B008 - typer's way to declare a repeatable option
        [],
        "--overlay",
        exists=True,
        dir_okay=False,
        help="YAML merged over the recipe, key by key (repeatable, in order; paths stay relative to the recipe).",
    ),
    set_: list[str] = typer.Option(  # noqa: B008
        [],
        "--set",
        help="PATH=VALUE applied after the overlays, VALUE as YAML (repeatable): --set components.trainer.max_steps=10",
    ),
    no_live: bool = typer.Option(False, "--no-live", help="Structured log lines instead of the live table."),
    plain: bool = typer.Option(
        False, "--plain", help="A plain line per event and a status line (the default when output is not a terminal)."
    ),
    status_every: float = typer.Option(5.0, "--status-every", min=0.1, help="Seconds between plain status lines."),
    duration: float | None = typer.Option(None, "--duration", min=0.1, help="Stop cleanly after this many seconds."),
) -> None:
    """Start a recipe's components (engine, proxy, Env, consumers, trainers) and supervise them until Ctrl-C.

    Exits 0 once the run completed (or ran its --duration with nothing failing), 1 after a failure, 130 after
    Ctrl-C (128 + the signal's number for another stop signal)."""
    from orchard.run.live import BusMetrics
    from orchard.run.supervisor import Supervisor, install_signal_handlers

    directory, config, previous_starts = _prepare(recipe, run_dir, resume, overlay, set_)
    orchard_config = resolve_orchard_config(config, directory.root, settings)
    _check_same_backends(directory, orchard_config, resumed=resume is not None)
    _write_run_files(directory, config, orchard_config, recipe_given=bool(recipe or overlay or set_))
    check_components(config, directory.root, directory.orchard_config)
    configure_logging(orchard_config.log_format, orchard_config.log_level)
    if config.create_topics:
        _create_standard_topics(orchard_config)

    env = {**os.environ, **secret_environment(orchard_config, directory), "PYTHONUNBUFFERED": "1",
           "ORCHARD_CONFIG": str(directory.orchard_config.resolve())}  # fmt: skip
    supervisor = Supervisor(config, directory, env, cwd=os.getcwd(), resumed=previous_starts,
                            bus=orchard_config.bus, run_id=orchard_config.run_id)  # fmt: skip
    stop = StopSignal(supervisor.request_stop)
    install_signal_handlers(stop)
    view = _view(BusMetrics(orchard_config), supervisor, directory, no_live=no_live, plain=plain,
                 status_every=status_every)  # fmt: skip
    watch, started = FailureWatch(view), time.monotonic()
    with view:
        outcome = supervisor.run(watch, duration_s=duration)
    code = exit_code(outcome, stop.signum, watch.failing)
    reason = f"signal {signal.Signals(stop.signum).name}" if outcome == "stopped" and stop.signum else supervisor.reason
    _report(outcome, reason, watch.failing, code, time.monotonic() - started)
    _last_lines(directory, supervisor.failed_components())
    _where_to_look(directory, orchard_config, completed=outcome == "completed")
    if code:
        raise typer.Exit(code)


def _view(
    metrics: BusMetrics, supervisor: Supervisor, directory: RunDir, *, no_live: bool, plain: bool, status_every: float
) -> RunScreen:
    """Structured log lines (``--no-live``), plain lines (``--plain``, or output that is not a terminal), or the
    live screen (the stage, its progress and figures, the components folded per stage, fitted to the terminal)."""
    from orchard.run.live import LiveView, LogView
    from orchard.run.plain import PlainView

    if no_live:
        return LogView(metrics)
    if plain or not console.is_terminal:
        return PlainView(metrics, supervisor.stages, directory, every_s=status_every)
    return LiveView(metrics, supervisor.stages, directory, console=console)


class StopSignal:
    """The signal handler of a run: remembers the first stop signal, then asks the supervisor to stop."""

    def __init__(self, request_stop: Callable[[int, Any], None]) -> None:
        self.request_stop = request_stop
        self.signum: int | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        """Handle SIGINT or SIGTERM."""
        self.signum = self.signum or signum
        self.request_stop(signum, frame)


class FailureWatch:
    """Passes the supervisor's updates on to a view and notes which components are failing when the run stops
    (failed, or down and waiting to restart): a run stopped by ``--duration`` then is not a success."""

    def __init__(self, view: RunScreen) -> None:
        self.view = view
        self.failing: list[str] = []

    def update(self, components: list[ComponentState]) -> None:
        """Note the failing components until the supervisor starts stopping them; show the update."""
        if not any(c.status == "stopping" for c in components):
            self.failing = [c.name for c in components if c.status in ("failed", "backoff")]
        self.view.update(components)


def exit_code(outcome: str, signum: int | None, failing: list[str]) -> int:
    """0 for a completed run, or one stopped by its duration with nothing failing; 1 after a failure; 128 + the
    signal's number (130 for Ctrl-C) for a run stopped by a signal."""
    if outcome == "completed":
        return 0
    if outcome == "failed":
        return 1
    if signum is not None:
        return SIGNAL_EXIT_BASE + signum
    return 1 if failing else 0


def _where_to_look(directory: RunDir, orchard_config: OrchardConfig, *, completed: bool) -> None:
    from orchard.run.summary import published_weights, summary_lines

    for line in summary_lines(directory, published_weights(orchard_config), completed=completed):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _last_lines(directory: RunDir, names: list[str], count: int = 8) -> None:
    """The end of each failed component's log, so the reason is on the screen and not only in logs/NAME.log."""
    from orchard.run.summary import log_tail

    for name in names:
        lines = log_tail(directory.log(name), count)
        if lines:
            console.print(f"last lines of {directory.log(name)}:", highlight=False, soft_wrap=True, markup=False)
            for line in lines:
                console.print(f"  {line}", highlight=False, soft_wrap=True, markup=False)


def _report(outcome: str, reason: str, failing: list[str], code: int, seconds: float) -> None:
    colour = {"failed": "red", "completed": "green"}.get(outcome, "yellow")
    trouble = f"; failing when it stopped: {', '.join(failing)}" if failing and outcome != "failed" else ""
    minutes, secs = divmod(int(seconds), 60)
    took = f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"
    console.print(f"[{colour}]{outcome}[/] ({escape(reason)}{escape(trouble)}) after {took}, exit code {code}",
                  highlight=False, soft_wrap=True)  # fmt: skip


def _prepare(
    recipe: Path | None, run_dir: Path | None, resume: Path | None, overlays: list[Path], sets: list[str]
) -> tuple[RunDir, RunConfig, int]:
    """The run directory, the validated recipe (overlays and ``--set`` applied), and how many times the run was
    started before."""
    from orchard.run.supervisor import ensure_not_running

    if resume is not None and run_dir is not None:
        raise RunError("give --run-dir for a new run or --resume for an existing one, not both")
    if resume is not None:
        directory = RunDir(resume)
        source = recipe or directory.recipe
        if not source.exists():
            raise RunError(f"{resume} is not a run directory: it has no {directory.recipe.name}")
        return directory, load_run_config(source, overlays, sets), ensure_not_running(directory)
    if recipe is None:
        raise RunError("give a RECIPE to start a run, or --resume RUN_DIR to continue one")
    directory = RunDir(run_dir or default_run_dir(recipe))
    if directory.state.exists():
        raise RunError(f"{directory.root} already holds a run; continue it with --resume {directory.root}")
    config = load_run_config(recipe, overlays, sets)
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
