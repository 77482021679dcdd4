"""``orchard train value`` (the value trainer) and ``orchard eval``: held-out evaluation (``--tasks``; pass@K with
``--attempts K``, value-model best-of-K with ``--rerank K``, a per-label breakdown with ``--by``), the reward curve
(``--plot``) and value-model reranking of K candidates per task (``--rerank K`` with ``--source``/``--topic``).

Both are plain typer command functions; ``orchard.cli.main`` / ``orchard.cli.train`` register them. Torch is
imported only inside the commands, so ``orchard --help`` stays fast.
"""

from __future__ import annotations

import math
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orchard.cli.common import console, state
from orchard.exceptions import OrchardError
from orchard.topics import TRAJECTORIES

if TYPE_CHECKING:
    from rich.table import Table

    from orchard.bus import Bus
    from orchard.config import OrchardConfig
    from orchard.evaluation.breakdown import LabelGroup
    from orchard.evaluation.cost import EvalCost
    from orchard.evaluation.heldout import HeldoutResult, Picker
    from orchard.evaluation.results import StageRow
    from trainers.rerank import LabelledCandidate, RerankReport
    from trainers.value import ValueModel


def value(
    ctx: typer.Context,
    model: str = typer.Option(
        "tiny-llama",
        help="Backbone: a tiny-family name, a checkpoint directory, or policy:NAME (this run's newest published "
        "version of policy NAME).",
    ),
    name: str = typer.Option("value", help="Model name of the published versions (PolicyVersion.model)."),
    topic: str = typer.Option(TRAJECTORIES, help="Topic of Trajectory records."),
    group: str | None = typer.Option(None, help="Consumer group (default: <run_id>.value-trainer.<name>)."),
    batch_size: int = typer.Option(16, min=1, help="Trajectories per optimizer step."),
    learning_rate: float = typer.Option(1e-4, min=0.0, help="AdamW learning rate."),
    max_length: int = typer.Option(1024, min=8, help="Tokens kept from the end of each trajectory."),
    label: str = typer.Option("success", help="Target: 'success' or 'reward' (clipped to [0, 1])."),
    publish_every: int = typer.Option(100, min=1, help="Publish a version every this many steps."),
    checkpoint_every: int = typer.Option(100, min=1, help="Checkpoint every this many steps."),
    max_steps: int | None = typer.Option(None, min=1, help="Stop after this many steps (default: run until Ctrl-C)."),
    idle_exit: float | None = typer.Option(
        None, "--idle-exit", min=1.0, help="Also stop (publishing first) once no trajectory came for this many seconds."
    ),
    input_kind: str = typer.Option(
        "stream",
        "--input",
        help="stream: trajectories as they arrive; complete: every trajectory on the topic at start, sorted by task "
        "and episode, one pass, then publish and exit (no idle time decides anything).",
    ),
    seed: int = typer.Option(0, help="Seed of the backbone (tiny) and the head."),
    work_dir: Path | None = typer.Option(None, help="Scratch directory (default: a temporary one)."),
) -> None:
    """Train the value model on finished trajectories from the bus; publish versions and checkpoints to the store."""
    from orchard.store import open_store
    from trainers.value import ValueModelConfig
    from trainers.value_trainer import ValueTrainerConfig, run_value_trainer

    cli = state(ctx)
    config = cli.config()
    try:
        trainer_config = ValueTrainerConfig(
            run_id=config.run_id,
            name=name,
            value_model=ValueModelConfig(model=model, seed=seed, max_length=max_length),
            topic=topic,
            group=group,
            label=label,  # type: ignore[arg-type] - validated by the model
            batch_size=batch_size,
            learning_rate=learning_rate,
            publish_every=publish_every,
            checkpoint_every=checkpoint_every,
            max_steps=max_steps,
            input=input_kind,  # type: ignore[arg-type] - validated by the model
        )
    except ValueError as exc:
        raise OrchardError(f"invalid value trainer option: {exc}") from exc
    if input_kind == "complete" and idle_exit is not None:
        raise OrchardError("--idle-exit ends a stream; --input complete ends after its one pass")
    stop = threading.Event()
    with cli.bus() as bus, open_store(config.store) as store, tempfile.TemporaryDirectory() as tmp:
        try:
            idle_polls = math.ceil(idle_exit / trainer_config.poll_timeout_s) if idle_exit is not None else None
            trainer = run_value_trainer(
                bus, store, trainer_config, scratch_dir=work_dir or Path(tmp), stop=stop, max_idle_polls=idle_polls
            )
        except KeyboardInterrupt:
            console.print("[yellow]stopped[/]: the last checkpoint holds the offsets to resume from")
            return
    console.print(f"value trainer: step {trainer.step}, version {trainer.version}, skipped {trainer.skipped}")


DEFAULT_RERANK_K = 4
DEFAULT_GREEDY_MARGIN = 0.1
"""A value model rates plausible episodes within ~0.01 of each other; 0.1 leaves such near-ties to greedy decoding."""


@dataclass(frozen=True)
class HeldoutOptions:
    """The options of a held-out evaluation, as given."""

    tasks: Path
    env: str | None
    env_token: str | None
    harness: str
    model: str | None
    stage: str | None
    run_dir: Path | None
    temperature: float | None
    timeout_s: float
    ci: str
    attempts: int | None = None
    by: tuple[str, ...] = ()
    greedy_first: bool = False
    greedy_margin: float | None = None  # resolved: None keeps no episode first (no --greedy-first)
    wait_for_engine: str | None = None
    wait_timeout_s: float = 600.0
    policy_version: int | None = None  # with wait_for_engine: this version exactly, not the newest
    seed: int | None = None  # each episode's harness samples with a seed derived from this

    def missing(self) -> list[str]:
        """The required options not given."""
        required = {"--env": self.env, "--env-token (or ORCHARD_ENV_TOKEN)": self.env_token, "--model": self.model,
                    "--stage": self.stage, "--run-dir": self.run_dir}  # fmt: skip
        return [flag for flag, value in required.items() if not value]


def eval_rerank(
    ctx: typer.Context,
    rerank: int | None = typer.Option(
        None,
        "--rerank",
        "-k",
        min=1,
        help="Candidates per task to choose from (K; default 4 with --source/--topic). With --tasks: K episodes per "
        "held-out task, the value model picks one.",
    ),
    greedy_first: bool = typer.Option(
        False,
        "--greedy-first",
        help="With --tasks and K > 1: each task's first episode decodes greedily (temperature 0), the others at "
        "--temperature, so the candidates include the greedy answer.",
    ),
    greedy_margin: float | None = typer.Option(
        None,
        "--greedy-margin",
        min=0.0,
        max=1.0,
        help="With --greedy-first and --rerank: the greedy episode is kept unless the value model rates another more "
        "than this much higher (P(success); default 0.1); 0 picks the highest score.",
    ),
    attempts: int | None = typer.Option(
        None,
        "--attempts",
        min=1,
        help="With --tasks: K episodes per task; a task is solved when any succeeds (pass@K, pass@1 beside it). "
        "Not with --rerank.",
    ),
    by: list[str] | None = typer.Option(
        None,
        "--by",
        metavar="LABEL",
        help="With --tasks: break results down by this task label (repeatable; default: repo when every task has it).",
    ),
    source: Path | None = typer.Option(
        None, "--source", help="JSONL of candidates {task_id, candidate_id, text|token_ids, success?}."
    ),
    topic: str | None = typer.Option(None, "--topic", help="Read the run's Trajectory records from this topic."),
    value_model: Path | None = typer.Option(
        None, "--value-model", help="Directory of a value model (default: the run's latest published version)."
    ),
    name: str = typer.Option("value", help="Model name of the published value model."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write one JSON line per task's pick here."),
    tasks: Path | None = typer.Option(
        None, "--tasks", file_okay=False, help="Held-out evaluation: a directory of task directories (an eval split)."
    ),
    env: str | None = typer.Option(None, "--env", help="Base URL of Orchard Env, e.g. http://127.0.0.1:8200."),
    env_token: str | None = typer.Option(
        None, "--env-token", envvar="ORCHARD_ENV_TOKEN", help="Env bearer token (default: $ORCHARD_ENV_TOKEN)."
    ),
    harness: str = typer.Option("builtin", "--harness", help="Harness of the evaluation episodes."),
    model: str | None = typer.Option(None, "--model", help="Model name the harness asks the proxy for."),
    stage: str | None = typer.Option(None, "--stage", help="Name of the evaluated stage (its row in the table)."),
    run_dir: Path | None = typer.Option(
        None,
        "--run-dir",
        file_okay=False,
        help="Where results.md/json or reward_curve.png go (its orchard.yaml is the config unless --config is given).",
    ),
    temperature: float | None = typer.Option(None, "--temperature", min=0.0, help="Sampling temperature (harness)."),
    seed: int | None = typer.Option(
        None, "--seed", min=0, help="With --tasks: each episode samples with its own seed, derived from this one."
    ),
    timeout_s: float = typer.Option(1800.0, "--timeout", min=1.0, help="Longest wait for the outcomes, seconds."),
    wait_for_engine: str | None = typer.Option(
        None,
        "--wait-for-engine",
        metavar="URL",
        help="With --tasks: first wait until the engine at URL (without /v1) serves the run's newest policy version.",
    ),
    wait_timeout_s: float = typer.Option(
        600.0, "--wait-timeout", min=0.0, help="Longest wait for --wait-for-engine, seconds (then exit 1)."
    ),
    policy_version: int | None = typer.Option(
        None,
        "--policy-version",
        min=0,
        help="With --wait-for-engine: wait for this version, not the newest, and refuse an engine serving another "
        "(an earlier policy of the run, served by `orchard engine serve --reload --max-version`).",
    ),
    ci: str = typer.Option("normal", "--reward-ci", help="Interval of the mean reward: normal or bootstrap."),
    plot: bool = typer.Option(False, "--plot", help="Write RUN_DIR/reward_curve.png from the run's outcomes."),
    window: int = typer.Option(50, "--window", min=1, help="Episodes in the rolling means of --plot."),
) -> None:
    """Evaluate: held-out success with 95% intervals (--tasks), the reward curve (--plot), or value-model reranking
    of K candidates per task (--source/--topic)."""
    if attempts is not None and rerank is not None:
        raise OrchardError(
            "--attempts and --rerank are mutually exclusive: --attempts K counts a task solved when any of its K "
            "episodes succeeds (pass@K); --rerank K lets the value model pick one of K"
        )
    if tasks is None and (attempts is not None or by or greedy_first or seed is not None):
        raise OrchardError("--attempts, --by, --greedy-first and --seed belong to a held-out evaluation: give --tasks")
    if greedy_margin is not None and not (greedy_first and rerank is not None and rerank > 1):
        raise OrchardError(
            "--greedy-margin decides between the greedy episode and the others: give --greedy-first and --rerank K > 1"
        )
    if tasks is None and wait_for_engine:
        raise OrchardError("--wait-for-engine belongs to a held-out evaluation: give --tasks")
    if policy_version is not None and not wait_for_engine:
        raise OrchardError("--policy-version names the version --wait-for-engine waits for: give --wait-for-engine")
    if plot:
        _plot(ctx, run_dir, window)
    elif tasks is not None:
        options = HeldoutOptions(
            tasks, env, env_token, harness, model, stage, run_dir, temperature, timeout_s, ci, attempts,
            tuple(by or ()), greedy_first, _keep_greedy_within(greedy_first, greedy_margin), wait_for_engine,
            wait_timeout_s, policy_version, seed,
        )  # fmt: skip
        _heldout(ctx, options, rerank, value_model, name)
    else:
        _rerank_candidates(ctx, rerank or DEFAULT_RERANK_K, source, topic, value_model, name, output)


def _use_run_config(ctx: typer.Context, run_dir: Path) -> None:
    """Read the run directory's ``orchard.yaml`` when no config was given (what ``orchard run`` components read)."""
    cli = state(ctx)
    if cli.config_path is None and (run_dir / "orchard.yaml").is_file():
        cli.config_path = run_dir / "orchard.yaml"


def _plot(ctx: typer.Context, run_dir: Path | None, window: int) -> None:
    from orchard.evaluation.plot import write_reward_curve

    if run_dir is None:
        raise OrchardError("--plot needs --run-dir (where reward_curve.png is written)")
    _use_run_config(ctx, run_dir)
    cli = state(ctx)
    config = cli.config()
    with cli.bus() as bus:
        path = write_reward_curve(bus, run_dir, config.run_id, window=window)
    console.print(f"reward curve written to {path}")


def _heldout(
    ctx: typer.Context, options: HeldoutOptions, rerank: int | None, value_model: Path | None, name: str
) -> None:
    from orchard.evaluation.breakdown import breakdown_labels
    from orchard.evaluation.heldout import HeldoutConfig, evaluate_heldout
    from orchard.evaluation.results import record_stage
    from orchard.evaluation.tasks import tasks_in
    from producers.rollout.scheduler import EnvSubmitter

    missing = options.missing()
    if missing:
        raise OrchardError(f"a held-out evaluation (--tasks) also needs {', '.join(missing)}")
    if options.run_dir is None or options.env is None or options.env_token is None:  # narrowed by missing()
        raise OrchardError("a held-out evaluation needs --run-dir, --env and --env-token")
    _use_run_config(ctx, options.run_dir)
    cli = state(ctx)
    config = cli.config()
    if options.wait_for_engine:
        _wait_for_engine(options.wait_for_engine, config, options.wait_timeout_s, options.policy_version)
    tasks = tasks_in(options.tasks)
    labels = {task.task_id: task.labels for task in tasks}
    samples, selection = _selection(options.attempts, rerank)
    try:
        heldout = HeldoutConfig(
            run_id=config.run_id, stage=options.stage, harness=options.harness, model=options.model,
            samples_per_task=samples, selection=selection, by=breakdown_labels(options.by, labels.values()),
            timeout_s=options.timeout_s, ci_method=options.ci, greedy_first=options.greedy_first, seed=options.seed,
            options={"harness": {"temperature": options.temperature}} if options.temperature is not None else {},
        )  # type: ignore[arg-type]  # fmt: skip
    except ValueError as exc:
        raise OrchardError(f"invalid evaluation option: {exc}") from exc
    submitter = EnvSubmitter(options.env, options.env_token)
    with cli.bus() as bus, tempfile.TemporaryDirectory() as tmp:
        picker: Picker | None = None
        if selection == "rerank":
            picker = _value_picker(ctx, bus, config.run_id, value_model, name, Path(tmp), options.greedy_margin)
        try:
            result = evaluate_heldout(bus, heldout, list(labels), submitter, picker=picker, labels=labels)
        finally:
            submitter.close()
        _print_picks(picker)
    rows = record_stage(options.run_dir, result)
    _print_heldout(result, options.run_dir)
    _print_paired(next(row for row in rows if row.stage == result.stage))


def _keep_greedy_within(greedy_first: bool, greedy_margin: float | None) -> float | None:
    """The margin the greedy episode keeps its place within: none without --greedy-first, else the given or default."""
    if not greedy_first:
        return None
    return DEFAULT_GREEDY_MARGIN if greedy_margin is None else greedy_margin


def _print_picks(picker: Picker | None) -> None:
    """How often the value model overrode the greedy episode (and how often a near-tie kept it)."""
    from orchard.evaluation.rerank import ValuePicker

    if isinstance(picker, ValuePicker) and picker.keep_first_within is not None:
        console.print(
            f"value model: greedy episode replaced in {picker.overrides} tasks, kept within "
            f"{picker.keep_first_within} of the best in {picker.kept_first}; fallbacks {picker.fallbacks}"
        )


def _wait_for_engine(engine: str, config: OrchardConfig, timeout_s: float, version: int | None = None) -> None:
    """Wait until ``engine`` serves the run's newest policy version, so the evaluation measures the policy the stage
    trained and not the one before it (the reloading engine picks new weights up a moment after they are published);
    with ``version``, until it serves that one (``_wait_for_version``)."""
    from orchard.run.stages import wait_for_newest_policy

    if version is not None:
        _wait_for_version(engine, version, timeout_s)
    elif wait_for_newest_policy(engine, config.bus, config.run_id, timeout_s) is None:
        raise OrchardError(f"the engine at {engine} did not serve the run's newest policy version within {timeout_s}s")


def _wait_for_version(engine: str, version: int, timeout_s: float) -> None:
    """Wait until ``engine`` serves policy ``version``; refuse one that serves a newer version (it is not pinned)."""
    import httpx

    from orchard.evaluation.engine_wait import served_version, wait_until_served

    served = wait_until_served(engine, lambda: version, timeout_s)
    if served is None:
        with httpx.Client(timeout=5.0) as client:  # what it serves instead says why: an older version, or nothing
            now = served_version(engine, client)
        serving = "does not answer" if now is None else f"serves version {now} (is v{version} in the store?)"
        raise OrchardError(
            f"--policy-version {version}: the engine at {engine} did not serve it within {timeout_s}s; it {serving}"
        )
    if served != version:
        raise OrchardError(
            f"--policy-version {version}: the engine at {engine} serves version {served}; pin it with "
            f"`orchard engine serve --reload --max-version {version}`"
        )


def _selection(attempts: int | None, rerank: int | None) -> tuple[int, str]:
    """Episodes per task and the selection: pass@K for --attempts, the value model for --rerank K > 1."""
    if attempts is not None:
        return attempts, "pass" if attempts > 1 else "first"
    if rerank is not None and rerank > 1:
        return rerank, "rerank"
    return 1, "first"


def _value_picker(
    ctx: typer.Context, bus: Bus, run_id: str, value_model: Path | None, name: str, tmp: Path, margin: float | None
) -> Picker:
    from orchard.evaluation.rerank import BusTrajectories, ValuePicker
    from trainers.rerank import Reranker

    model = _load_value_model(ctx, value_model, name, tmp)
    return ValuePicker(Reranker(model), BusTrajectories(bus, run_id), keep_first_within=margin)


def _print_heldout(result: HeldoutResult, run_dir: Path) -> None:
    from orchard.evaluation.report import selection_text
    from orchard.evaluation.results import stage_paths

    success = result.success
    console.print(
        f"stage {result.stage}: success {success.rate:.1%} ({success.successes}/{success.n}), "
        f"95% CI [{success.low:.1%}, {success.high:.1%}], mean reward {result.reward.mean:.3f}, "
        f"{result.wall_time_s:.1f}s"
    )
    if result.samples_per_task > 1:
        line = (f"selection {selection_text(result.selection, result.samples_per_task)}; "
                f"pass@{result.samples_per_task} {result.any_success:.1%}, "
                f"pass@1 {result.mean_success:.1%} (mean over attempts)")  # fmt: skip
        console.print(line, highlight=False, soft_wrap=True)
    for label, groups in result.breakdowns.items():
        console.print(_breakdown_table(label, groups))
    if result.cost is not None:
        console.print(_cost_line(result.cost), highlight=False, soft_wrap=True)
    if result.missing:
        console.print(f"[yellow]{len(result.missing)} episode(s) had no outcome in time; counted as failures[/]")
    detail_json, detail_md = stage_paths(run_dir, result.stage)
    console.print(f"results table: {run_dir / 'results.md'}", soft_wrap=True)
    console.print(f"stage detail: {detail_md} and {detail_json}", soft_wrap=True)


def _print_paired(row: StageRow) -> None:
    """The stage against the one before it in the table: wins, losses, pairs and the exact McNemar p-value."""
    from orchard.evaluation.results import p_value_text

    if row.vs_stage is None:
        return
    line = (f"vs {row.vs_stage}: {row.wins} wins, {row.losses} losses on {row.pairs} paired tasks, "
            f"exact McNemar p = {p_value_text(row.p_value)}")  # fmt: skip
    console.print(line, highlight=False, soft_wrap=True)


def _breakdown_table(label: str, groups: list[LabelGroup]) -> Table:
    from rich.table import Table

    table = Table(title=f"by {label}", title_justify="left")
    for column in (label, "tasks", "success", "95% CI", "pass@1"):
        table.add_column(column, justify="left" if column == label else "right")
    for g in groups:
        table.add_row(g.value, str(g.success.n), f"{g.success.rate:.1%} ({g.success.successes}/{g.success.n})",
                      f"[{g.success.low:.1%}, {g.success.high:.1%}]", f"{g.pass_at_1:.1%}")  # fmt: skip
    return table


def _cost_line(cost: EvalCost) -> str:
    tokens = "tokens not counted"
    if cost.prompt_tokens is not None and cost.completion_tokens is not None:
        partial = "" if cost.tokens_complete else f" (from {cost.calls_read} of {cost.model_calls} calls only)"
        tokens = f"{cost.prompt_tokens:,} prompt + {cost.completion_tokens:,} completion tokens{partial}"
    mean = "" if cost.mean_episode_time_s is None else f", {cost.mean_episode_time_s:.1f}s mean"
    return (f"cost: {cost.model_calls:,} model calls, {tokens}, wall {cost.wall_time_s:.1f}s, "
            f"episodes {cost.episode_time_s:.1f}s in total{mean}")  # fmt: skip


def _rerank_candidates(
    ctx: typer.Context,
    rerank: int,
    source: Path | None,
    topic: str | None,
    value_model: Path | None,
    name: str,
    output: Path | None,
) -> None:
    """Pick the best of K candidates per task with the value model; with labels, compare to a random pick."""
    from orchard.evaluation.rerank import read_run_trajectories, write_picks
    from trainers.rerank import Reranker, candidates_from_trajectories, read_candidates_jsonl, rerank_tasks

    if (source is None) == (topic is None):
        raise OrchardError(
            "give exactly one of --source (a JSONL file) or --topic (Trajectory records); "
            "or --tasks for a held-out evaluation, or --plot for the reward curve"
        )
    cli = state(ctx)
    config = cli.config()
    if source is not None:
        candidates = read_candidates_jsonl(source)
    else:
        with cli.bus() as bus:
            candidates = candidates_from_trajectories(read_run_trajectories(bus, str(topic), config.run_id))
    with tempfile.TemporaryDirectory() as tmp:
        model = _load_value_model(ctx, value_model, name, Path(tmp))
        report = rerank_tasks(Reranker(model), candidates, rerank)
    _print_report(report, rerank, candidates)
    if output is not None:
        write_picks(output, report.picks)


def _load_value_model(ctx: typer.Context, path: Path | None, name: str, tmp: Path) -> ValueModel:
    from orchard.evaluation.rerank import download_value_model
    from orchard.store import open_store
    from trainers.value import VALUE_INFO_FILE, ValueModel, ValueModelConfig

    if path is not None:
        if not (path / VALUE_INFO_FILE).is_file():
            raise OrchardError(f"{path} is not a value model directory (no {VALUE_INFO_FILE})")
        return ValueModel.build(ValueModelConfig(model=str(path)))
    config = state(ctx).config()
    with open_store(config.store) as store:
        artifact, version = download_value_model(store, config.run_id, name, tmp)
    console.print(f"value model {artifact} v{version}")
    return ValueModel.load(tmp)


def _print_report(report: RerankReport, k: int, candidates: list[LabelledCandidate]) -> None:
    console.print(f"reranked {len(report.picks)} tasks, K={k}, from {len(candidates)} candidates")
    if report.picked_success is not None:
        console.print(
            f"success of the pick {report.picked_success:.3f} | random pick {report.mean_success:.3f} | "
            f"best possible {report.oracle_success:.3f}"
        )
