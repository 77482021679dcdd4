"""``orchard track RUN_DIR --to tensorboard [--to wandb] [--follow]``: send a run's figures to trackers
(``orchard.tracking``), once or until the run ends; a recipe runs it as a ``kind: command`` component."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Literal, cast

import typer

from orchard.cli.common import console, state
from orchard.exceptions import OrchardError
from orchard.tracking import (
    Follower,
    TensorBoardTrackerConfig,
    TrackerConfig,
    WandbTrackerConfig,
    follow,
    open_tracker,
    run_over,
)


def track(
    ctx: typer.Context,
    run_dir: Path = typer.Argument(..., help="Run directory (its orchard.yaml names the run id and the bus)."),
    to: list[str] = typer.Option(..., "--to", help="Tracker: 'tensorboard' or 'wandb' (repeatable)."),
    follow_run: bool = typer.Option(False, "--follow", help="Keep sending until the run ends (state.json)."),
    poll: float = typer.Option(5.0, min=0.1, help="With --follow: seconds between passes."),
    samples: int = typer.Option(5, min=0, help="Sample episodes kept per policy version."),
    wandb_project: str = typer.Option("orchard", help="W&B project."),
    wandb_entity: str | None = typer.Option(None, help="W&B entity (default: the account's)."),
    wandb_mode: str = typer.Option("offline", help="'offline' (files under RUN_DIR/tracking/wandb) or 'online'."),
) -> None:
    """Send every trainer's metrics, the held-out results and the training throughput to TensorBoard and/or W&B."""
    if not run_dir.is_dir():
        raise OrchardError(f"run directory {run_dir} does not exist")
    configs = [_tracker_config(name, wandb_project, wandb_entity, wandb_mode) for name in dict.fromkeys(to)]
    cli = state(ctx)
    if cli.config_path is None and (run_dir / "orchard.yaml").is_file():
        cli.config_path = run_dir / "orchard.yaml"
    config, root = cli.config(), run_dir.resolve()
    followers: list[Follower] = []
    try:
        for tracker_config in configs:
            tracker = open_tracker(tracker_config, root, config.run_id)
            state_path = root / "tracking" / f"{tracker_config.type}.state.json"
            followers.append(Follower(root, config.run_id, tracker, state_path, bus=config.bus, samples=samples))
        if follow_run:
            follow(followers, root, poll_s=poll, stop=_stop_on_sigterm())
        else:
            for tracker_config, follower in zip(configs, followers, strict=True):
                console.print(f"{tracker_config.type}: sent {follower.sync(final=run_over(root))} points")
    finally:
        for follower in followers:
            follower.close()


def _tracker_config(name: str, project: str, entity: str | None, mode: str) -> TrackerConfig:
    if name == "tensorboard":
        return TensorBoardTrackerConfig()
    if name == "wandb":
        if mode not in ("offline", "online"):
            raise typer.BadParameter("--wandb-mode is 'offline' or 'online'")
        return WandbTrackerConfig(project=project, entity=entity, mode=cast(Literal["offline", "online"], mode))
    raise typer.BadParameter(f"--to {name!r}: the trackers are 'tensorboard' and 'wandb'")


def _stop_on_sigterm() -> Callable[[], bool]:
    """A flag SIGTERM sets (``orchard run`` stops its components so), for one last pass before exiting."""
    stopped = False

    def on_term(signum: int, frame: FrameType | None) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, on_term)
    return lambda: stopped
