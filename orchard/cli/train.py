"""``orchard train``: Trainers: policy and value models.

``orchard train policy [--config trainer.yaml] [--set key.path=value ...]`` runs the policy trainer on the bus and
store of the Orchard config (``orchard -c orchard.yaml`` / ``ORCHARD_*``). Other trainers add their own commands to
``app``.
"""

from __future__ import annotations

from pathlib import Path

import typer

from orchard.cli import train_value
from orchard.cli.common import console, state

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

    summary = PolicyTrainer(trainer_config, orchard_config).run()
    console.print(
        f"trained {summary.steps} steps ({summary.samples} samples, {summary.tokens} tokens); "
        f"policy version {summary.policy_version}; offsets {summary.offsets}"
    )


app.command("value")(train_value.value)
