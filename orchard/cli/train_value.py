"""``orchard train value`` (the value trainer) and ``orchard eval --rerank K`` (value-model reranking).

Both are plain typer command functions; ``orchard.cli.main`` / ``orchard.cli.train`` register them. Torch is
imported only inside the commands, so ``orchard --help`` stays fast.
"""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orchard.cli.common import console, state
from orchard.exceptions import OrchardError
from orchard.topics import TRAJECTORIES

if TYPE_CHECKING:
    from consumers.trajectory import Trajectory
    from orchard.bus import Bus
    from orchard.store import ArtifactStore
    from trainers.rerank import LabelledCandidate, RerankReport
    from trainers.value import ValueModel


def value(
    ctx: typer.Context,
    model: str = typer.Option("tiny-llama", help="Backbone: a tiny-family name or a checkpoint directory."),
    name: str = typer.Option("value", help="Model name of the published versions (PolicyVersion.model)."),
    topic: str = typer.Option(TRAJECTORIES, help="Topic of Trajectory records."),
    group: str = typer.Option("value-trainer", help="Consumer group."),
    batch_size: int = typer.Option(16, min=1, help="Trajectories per optimizer step."),
    learning_rate: float = typer.Option(1e-4, min=0.0, help="AdamW learning rate."),
    max_length: int = typer.Option(1024, min=8, help="Tokens kept from the end of each trajectory."),
    label: str = typer.Option("success", help="Target: 'success' or 'reward' (clipped to [0, 1])."),
    publish_every: int = typer.Option(100, min=1, help="Publish a version every this many steps."),
    checkpoint_every: int = typer.Option(100, min=1, help="Checkpoint every this many steps."),
    max_steps: int | None = typer.Option(None, min=1, help="Stop after this many steps (default: run until Ctrl-C)."),
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
        )
    except ValueError as exc:
        raise OrchardError(f"invalid value trainer option: {exc}") from exc
    stop = threading.Event()
    with cli.bus() as bus, open_store(config.store) as store, tempfile.TemporaryDirectory() as tmp:
        try:
            trainer = run_value_trainer(bus, store, trainer_config, scratch_dir=work_dir or Path(tmp), stop=stop)
        except KeyboardInterrupt:
            console.print("[yellow]stopped[/]: the last checkpoint holds the offsets to resume from")
            return
    console.print(f"value trainer: step {trainer.step}, version {trainer.version}, skipped {trainer.skipped}")


def eval_rerank(
    ctx: typer.Context,
    rerank: int = typer.Option(4, "--rerank", "-k", min=1, help="Candidates per task to choose from (K)."),
    source: Path | None = typer.Option(
        None, "--source", help="JSONL of candidates {task_id, candidate_id, text|token_ids, success?}."
    ),
    topic: str | None = typer.Option(None, "--topic", help="Read the run's Trajectory records from this topic."),
    value_model: Path | None = typer.Option(
        None, "--value-model", help="Directory of a value model (default: the run's latest published version)."
    ),
    name: str = typer.Option("value", help="Model name of the published value model."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write one JSON line per task's pick here."),
) -> None:
    """Pick the best of K candidates per task with the value model; with labels, compare to a random pick."""
    from trainers.rerank import Reranker, candidates_from_trajectories, read_candidates_jsonl, rerank_tasks

    if (source is None) == (topic is None):
        raise OrchardError("give exactly one of --source (a JSONL file) or --topic (Trajectory records)")
    cli = state(ctx)
    config = cli.config()
    if source is not None:
        candidates = read_candidates_jsonl(source)
    else:
        with cli.bus() as bus:
            candidates = candidates_from_trajectories(_read_trajectories(bus, str(topic), config.run_id))
    with tempfile.TemporaryDirectory() as tmp:
        model = _load_value_model(ctx, value_model, name, Path(tmp))
        report = rerank_tasks(Reranker(model), candidates, rerank)
    _print_report(report, rerank, candidates)
    if output is not None:
        with open(output, "w", encoding="utf-8") as out:
            for task_id, pick in sorted(report.picks.items()):
                row = {"task_id": task_id, "candidate_id": pick.best_id, "score": pick.best_score}
                out.write(json.dumps(row) + "\n")


def _load_value_model(ctx: typer.Context, path: Path | None, name: str, tmp: Path) -> ValueModel:
    from orchard.store import open_store
    from trainers.value import VALUE_INFO_FILE, ValueModel, ValueModelConfig
    from trainers.weights import policy_artifact_name

    if path is not None:
        if not (path / VALUE_INFO_FILE).is_file():
            raise OrchardError(f"{path} is not a value model directory (no {VALUE_INFO_FILE})")
        return ValueModel.build(ValueModelConfig(model=str(path)))
    config = state(ctx).config()
    artifact = policy_artifact_name(config.run_id, name)
    with open_store(config.store) as store:
        version = store.latest_version(artifact)
        if version is None:
            raise OrchardError(f"no published value model {artifact} in {store.location}; pass --value-model")
        _download(store, artifact, version, tmp)
    return ValueModel.load(tmp)


def _download(store: ArtifactStore, artifact: str, version: int, dest: Path) -> None:
    store.download_version(artifact, version, dest, verify=True)
    console.print(f"value model {artifact} v{version}")


def _read_trajectories(bus: Bus, topic: str, run_id: str, max_idle_polls: int = 3) -> list[Trajectory]:
    from consumers.trajectory_records import trajectory_from_record
    from orchard.codec import Codec

    codec = Codec.default()
    found: list[Trajectory] = []
    with bus.consumer([topic], group=None, start="earliest") as consumer:
        idle = 0
        while idle < max_idle_polls:
            records = consumer.poll(timeout_s=1.0)
            idle = 0 if records else idle + 1
            for record in records:
                decoded = codec.decode(record.value)
                if decoded.name == "Trajectory" and decoded.record["run_id"] == run_id:
                    found.append(trajectory_from_record(decoded.record, codec))
    return found


def _print_report(report: RerankReport, k: int, candidates: list[LabelledCandidate]) -> None:
    console.print(f"reranked {len(report.picks)} tasks, K={k}, from {len(candidates)} candidates")
    if report.picked_success is not None:
        console.print(
            f"success of the pick {report.picked_success:.3f} | random pick {report.mean_success:.3f} | "
            f"best possible {report.oracle_success:.3f}"
        )
