"""``orchard rollout run``: start episodes on Orchard Env and wait for their outcomes on the bus.

Two modes. By default, the rollout scheduler (``producers.rollout.scheduler``) runs rounds over the tasks of a task
directory, each task's group sized by Balanced Adaptive Rollout from the run's outcomes so far. With ``--demos DIR``
it submits exactly the demonstration episodes a scripted expert wrote (``DIR/demonstrations.jsonl``: episode id and
task id per line, as ``recipes.file_lookup.expert plan`` writes them), so an expert backend that routes by episode id
answers each with its own plan. Either way the command exits 0 once every episode it submitted has an outcome on the
bus, and 1 if some are still missing after the wait; episodes Env already has (a rerun) count as submitted, and
their outcomes, already on the bus, are found by the replay, so a rerun ends at once without running anything twice.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Literal, cast

import typer

from orchard.bus import Bus
from orchard.cli.common import err_console, state
from orchard.config import BusConfig
from orchard.episode_requests import EpisodeRequest, SubmitFn
from orchard.exceptions import ConfigError
from orchard.logging import get_logger
from producers.rollout.balanced import BalancedRolloutConfig
from producers.rollout.scheduler import EnvSubmitter, LockstepHooks

app = typer.Typer(help="Start episodes on Orchard Env: Balanced Adaptive Rollout rounds, or expert demonstrations.")
log = get_logger("cli.rollout")
ENV_TOKEN = "ORCHARD_ENV_TOKEN"  # noqa: S105 - the name of the variable, not a secret


@app.command("run")
def rollout_run(
    ctx: typer.Context,
    env: str = typer.Option(..., "--env", help="Base URL of Orchard Env, e.g. http://127.0.0.1:8200."),
    tasks: Path = typer.Option(..., "--tasks", exists=True, file_okay=False, help="Directory of task directories."),
    demos: Path | None = typer.Option(
        None, "--demos", exists=True, file_okay=False, help="Submit the demonstration episodes written in this dir."
    ),
    harness: str = typer.Option("builtin", "--harness", help="Harness of every episode."),
    model: str = typer.Option("policy", "--model", help="Model name the harness asks the proxy for."),
    rounds: int | None = typer.Option(None, "--rounds", min=1, help="Rollout rounds (default: 1 round)."),
    episodes: int | None = typer.Option(None, "--episodes", min=1, help="Cap on the episodes submitted in all."),
    budget: int = typer.Option(64, "--budget", min=1, help="BAR: rollouts per round over all tasks."),
    min_rollouts: int = typer.Option(2, "--min-rollouts", min=0, help="BAR: rollouts every task gets per round."),
    max_rollouts: int = typer.Option(32, "--max-rollouts", min=1, help="BAR: cap on one task's group per round."),
    max_task_outcomes: int | None = typer.Option(
        None, "--max-task-outcomes", min=1, help="BAR: a task with this many outcomes in the run gets no more rollouts."
    ),
    prior_successes: float = typer.Option(
        1.0, "--prior-successes", min=0.001, help="BAR: pseudo-successes of every task's prior (with --prior-failures)."
    ),
    prior_failures: float = typer.Option(
        1.0, "--prior-failures", min=0.001, help="BAR: pseudo-failures of every task's prior (uniform: 1 and 1)."
    ),
    aim: str = typer.Option(
        "mixed", "--aim", help="BAR: mixed (every mixed group alike) or failing (tasks the policy mostly fails first)."
    ),
    episode_timeout: float | None = typer.Option(None, "--episode-timeout", min=1.0, help="Env's per-episode limit."),
    wait_timeout: float = typer.Option(
        3600.0, "--wait-timeout", min=1.0, help="Longest wait for a round's (or the demos') outcomes, seconds."
    ),
    new_policy_wait: float | None = typer.Option(
        None,
        "--new-policy-wait",
        min=0.001,
        help="Before each round after the first, wait up to this many seconds for a newer policy version of the run "
        "(keeps rollouts near on-policy when the trainer is slower than the episodes).",
    ),
    seed: int | None = typer.Option(
        None, "--seed", min=0, help="Give each episode's harness its own sampling seed, derived from this one."
    ),
    lockstep: bool = typer.Option(
        False,
        "--lockstep",
        help="Train each round, whole, before the next: announce it once the --lockstep-after groups have made its "
        "samples, then wait for the version trained on it (needs a trainer with input: rounds).",
    ),
    lockstep_after: list[str] = typer.Option(
        ["assembler", "sample-builder"],
        "--lockstep-after",
        help="Consumer groups, in pipeline order, that must be done with their topics before a round is announced "
        "(repeat the option).",
    ),
    engine: str | None = typer.Option(
        None,
        "--engine",
        help="With --lockstep: the policy engine's base URL; each round waits until it serves the "
        "version trained on the round before.",
    ),
) -> None:
    """Roll out tasks (BAR rounds) or expert demonstrations on Orchard Env; exit 0 when all have outcomes."""
    if aim not in ("mixed", "failing"):
        raise typer.BadParameter(f"--aim {aim!r}: 'mixed' or 'failing'")
    if demos is not None and (new_policy_wait is not None or lockstep or seed is not None):
        raise ConfigError("--new-policy-wait, --lockstep and --seed apply to rollout rounds, not to --demos")
    if lockstep and new_policy_wait is not None:
        raise ConfigError("--lockstep waits for the version trained on each round; drop --new-policy-wait")
    if engine is not None and not lockstep:
        raise ConfigError("--engine is what --lockstep waits for; give --lockstep too")
    config = state(ctx).config()
    token = os.environ.get(ENV_TOKEN, "")
    if not token:
        raise ConfigError(f"{ENV_TOKEN} must be set (secrets come from the environment only)")
    task_ids = _task_ids(tasks)
    submitter = EnvSubmitter(env, token)
    bus = state(ctx).bus()
    try:
        if demos is not None:
            missing = _run_demos(bus, config.run_id, submitter, demos, task_ids, harness, model, episodes,
                                 episode_timeout, wait_timeout)  # fmt: skip
        else:
            bar = BalancedRolloutConfig(budget=budget, min_rollouts=min_rollouts, max_rollouts=max_rollouts,
                                        max_task_outcomes=max_task_outcomes, prior_successes=prior_successes,
                                        prior_failures=prior_failures,
                                        aim=cast(Literal["mixed", "failing"], aim))  # fmt: skip
            lockstep_hooks = _lockstep_hooks(config.bus, config.run_id, lockstep_after, engine) if lockstep else None
            missing = _run_rounds(bus, config.run_id, submitter, task_ids, harness, model, rounds, episodes, bar,
                                  episode_timeout, wait_timeout, new_policy_wait, seed, lockstep_hooks)  # fmt: skip
    finally:
        submitter.close()
        bus.close()
    if missing:
        err_console.print(f"[red]{missing} episode(s) have no outcome after {wait_timeout:g} s[/]")
        raise typer.Exit(1)


def _task_ids(tasks: Path) -> list[str]:
    from orchard.env.tasks import TaskCatalog

    catalog = TaskCatalog(tasks)
    if not catalog.tasks:
        raise ConfigError(f"--tasks {tasks}: no task directories in it")
    return sorted(catalog.tasks)


def read_demonstrations(demos: Path) -> list[tuple[str, str]]:
    """``(episode_id, task_id)`` of every line of ``demos/demonstrations.jsonl``, in file order."""
    path = demos / "demonstrations.jsonl"
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except OSError as exc:
        raise ConfigError(f"--demos {demos}: cannot read {path.name}: {exc}") from exc
    pairs = []
    for number, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
            pairs.append((str(entry["episode_id"]), str(entry["task_id"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}:{number}: not a demonstration line ({exc})") from exc
    return pairs


def _run_demos(
    bus: Bus, run_id: str, submit: SubmitFn, demos: Path, task_ids: list[str], harness: str, model: str,
    episodes: int | None, episode_timeout: float | None, wait_timeout: float,
) -> int:  # fmt: skip
    """Submit each demonstration episode once; the number still without an outcome after the wait."""
    known = set(task_ids)
    pairs = read_demonstrations(demos)[:episodes]
    unknown = sorted({task for _, task in pairs if task not in known})
    if unknown:
        raise ConfigError(f"--demos {demos}: tasks not in --tasks: {unknown[:5]}")
    outcomes = _OutcomeReader(bus, run_id)
    for episode_id, task_id in pairs:
        request = EpisodeRequest(task_id=task_id, group_id=f"demo-{task_id}", episode_id=episode_id,
                                 harness=harness, model=model, timeout_s=episode_timeout)  # fmt: skip
        submit(request)
    log.info("demonstrations submitted", run_id=run_id, episodes=len(pairs))
    try:
        return outcomes.wait_for({episode_id for episode_id, _ in pairs}, wait_timeout)
    finally:
        outcomes.close()


def _lockstep_hooks(bus_config: BusConfig, run_id: str, groups: list[str], engine: str | None) -> LockstepHooks:
    """The pipeline's groups, read from the bus like a stage condition, and the engine's served version."""
    import httpx

    from orchard.evaluation.engine_wait import served_version
    from orchard.run.stages import BusProbe

    if not groups:
        raise ConfigError("--lockstep needs the consumer groups to wait for (--lockstep-after)")
    probe = BusProbe(bus_config, run_id)
    client = httpx.Client(timeout=5.0)

    def caught_up() -> bool:  # in pipeline order: a group is asked only once every group before it is done
        return all(probe.caught_up(group) for group in groups)

    def serves(version: int) -> bool:
        serving = served_version(engine or "", client)
        return serving is not None and serving >= version

    return LockstepHooks(pipeline_caught_up=caught_up, engine_serves=serves if engine else None)


def _run_rounds(
    bus: Bus, run_id: str, submit: SubmitFn, task_ids: list[str], harness: str, model: str, rounds: int | None,
    episodes: int | None, bar: BalancedRolloutConfig, episode_timeout: float | None, wait_timeout: float,
    new_policy_wait: float | None = None, seed: int | None = None, hooks: LockstepHooks | None = None,
) -> int:  # fmt: skip
    """BAR rounds through the rollout scheduler; the episodes of the last round still without an outcome."""
    from producers.rollout.scheduler import LockstepTimeout, RolloutSchedulerConfig, run_rollout_scheduler

    config = RolloutSchedulerConfig(
        run_id=run_id, tasks=task_ids, harness=harness, model=model, rounds=rounds or 1, max_episodes=episodes,
        rollout=bar, round_timeout_s=wait_timeout, episode_timeout_s=episode_timeout,
        new_policy_wait_s=new_policy_wait, seed=seed, lockstep=hooks is not None,
    )  # fmt: skip
    try:
        scheduler = run_rollout_scheduler(bus, config, submit, hooks=hooks)
    except LockstepTimeout as exc:
        err_console.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None
    log.info("rollout finished", run_id=run_id, rounds=scheduler.rounds_submitted, episodes=scheduler.submitted,
             timed_out_rounds=scheduler.timed_out_rounds, out_of_tasks=scheduler.out_of_tasks,
             rounds_without_new_policy=scheduler.rounds_without_new_policy)  # fmt: skip
    if scheduler.out_of_tasks:  # fewer episodes than asked for: the stage must not pass as if it had them all
        err_console.print(f"[red]every task reached --max-task-outcomes after {scheduler.rounds_submitted} of "
                          f"{rounds or 1} rounds: give more tasks, fewer rounds or a higher cap[/]")  # fmt: skip
        raise typer.Exit(1)
    return len(scheduler.outstanding) + scheduler.timed_out_rounds


class _OutcomeReader:
    """Reads the whole ``outcomes`` topic (no group) and notes the episode ids of one run that have an outcome."""

    def __init__(self, bus: Bus, run_id: str) -> None:
        from orchard.codec import Codec
        from orchard.topics import OUTCOMES

        bus.create_topic(OUTCOMES, exist_ok=True)
        self._consumer = bus.consumer([OUTCOMES], group=None, start="earliest")
        self._codec, self.run_id = Codec.default(), run_id
        self.seen: set[str] = set()

    def wait_for(self, episode_ids: set[str], timeout_s: float) -> int:
        """Poll until every id in ``episode_ids`` has an outcome or ``timeout_s`` passes; how many are missing."""
        deadline = time.monotonic() + timeout_s
        while not episode_ids <= self.seen and time.monotonic() < deadline:
            for record in self._consumer.poll(timeout_s=1.0):
                decoded = self._codec.decode(record.value)
                if decoded.name == "EpisodeOutcome" and decoded.record["run_id"] == self.run_id:
                    self.seen.add(str(decoded.record["episode_id"]))
        missing = len(episode_ids - self.seen)
        log.info("outcomes awaited", run_id=self.run_id, expected=len(episode_ids), missing=missing)
        return missing

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()
