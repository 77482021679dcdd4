"""``orchard train``: Trainers: policy and value models.

``orchard train policy [--config trainer.yaml] [--set key.path=value ...]`` runs the policy trainer on the bus and
store of the Orchard config (``orchard -c orchard.yaml`` / ``ORCHARD_*``). Other trainers add their own commands to
``app``.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orchard.cli import train_value
from orchard.cli.common import console, state

if TYPE_CHECKING:
    from trainers.policy import PolicyTrainer

app = typer.Typer(help="Trainers: policy and value models.", no_args_is_help=True)


@app.command("policy")
def policy(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None, "--config", exists=True, dir_okay=False, help="YAML PolicyTrainerConfig (defaults if omitted)."
    ),
    overrides: list[str] = typer.Option(
        [], "--set", help="Override a field: --set lr=1e-5 --set loss.kind=rl (values are YAML)."
    ),
) -> None:
    """Train the policy on the samples topic: SFT and RL losses, publish versions, checkpoint with offsets."""
    from trainers.config import load_trainer_config

    trainer_config = load_trainer_config(config, overrides)  # validated before torch is imported
    orchard_config = state(ctx).config()

    from trainers.policy import PolicyTrainer

    trainer = PolicyTrainer(trainer_config, orchard_config)
    # SIGTERM (a recipe's stage stopping its trainer, a pod being deleted) drains: train what is on the topic,
    # publish, checkpoint, exit 0. A second SIGTERM, or SIGKILL, still ends it at once (the checkpoint resumes it).
    signal.signal(signal.SIGTERM, lambda signum, _frame: _drain_once(trainer, signum))
    summary = trainer.run()
    console.print(
        f"trained {summary.steps} steps ({summary.samples} samples, {summary.tokens} tokens); "
        f"policy version {summary.policy_version}; offsets {summary.offsets}"
    )


app.command("value")(train_value.value)


def _drain_once(trainer: PolicyTrainer, signum: int) -> None:
    """The first SIGTERM asks the trainer to drain; the next one takes the default action (exit)."""
    signal.signal(signum, signal.SIG_DFL)
    trainer.request_drain()
