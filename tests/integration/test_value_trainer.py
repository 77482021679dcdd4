"""The value trainer end to end: Trajectory records on the bus in, value-model versions in the store and on the bus out,
a restart that resumes from the checkpoint's offsets (nothing trained twice, nothing skipped), and the command
functions ``value`` (``orchard train value``) and ``eval_rerank`` (``orchard eval --rerank K``) on embedded defaults."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import typer
import yaml
from typer.testing import CliRunner, Result

from orchard.bus import Bus, open_bus
from orchard.cli.common import CliState
from orchard.cli.train_value import eval_rerank, value
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig, LocalStoreConfig
from orchard.engines.tiny import build_tiny_tokenizer
from orchard.store import ArtifactStore, open_store
from orchard.store.versions import manifest_key
from orchard.tokens import pack_logprobs, pack_token_ids
from orchard.topics import POLICY_VERSIONS, TRAJECTORIES
from orchard.trajectory_records import trajectory_record
from trainers.checkpoint import CheckpointStore
from trainers.value import ValueModel, ValueModelConfig
from trainers.value_trainer import ValueTrainerConfig, run_value_trainer

WHEN = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
CODEC = Codec.default()


def model_call(run_id: str, episode_id: str, prompt: np.ndarray, completion: np.ndarray) -> bytes:
    return CODEC.encode(
        "ModelCall",
        {
            "run_id": run_id,
            "episode_id": episode_id,
            "task_id": "task-1",
            "call_index": 0,
            "harness": "builtin",
            "api_flavour": "CHAT",
            "model": "policy",
            "policy_version": 1,
            "request_messages_json": "[]",
            "response_text": "",
            "finish_reason": "stop",
            "prompt_token_ids": pack_token_ids(prompt),
            "completion_token_ids": pack_token_ids(completion),
            "completion_logprobs": pack_logprobs(np.full(len(completion), -0.5)),
            "latency_ms": 1.0,
            "timestamp": WHEN,
        },
    )


def outcome(run_id: str, episode_id: str, success: bool) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "episode_id": episode_id,
        "task_id": "task-1",
        "group_id": "r000000-task-1",
        "status": "SUCCEEDED" if success else "FAILED",
        "reward": float(success),
        "success": success,
        "num_model_calls": 1,
        "policy_version": 1,
        "started_at": WHEN,
        "ended_at": WHEN,
    }


def trajectory_bytes(run_id: str, episode_id: str, success: bool, seed: int, complete: bool = True) -> bytes:
    """An encoded Trajectory record; a successful episode's completion ends with a test run that passes."""
    rng = np.random.default_rng(seed)
    marker = np.asarray(build_tiny_tokenizer().encode("All tests passed."), dtype=np.int32)
    ending = marker if success else rng.integers(3, 400, size=marker.size).astype(np.int32)
    prompt = rng.integers(3, 400, size=24).astype(np.int32)
    completion = np.concatenate([rng.integers(3, 400, size=8).astype(np.int32), ending])
    fields = outcome(run_id, episode_id, success)
    record = trajectory_record(
        run_id=run_id,
        episode_id=episode_id,
        task_id="task-1",
        calls=[model_call(run_id, episode_id, prompt, completion)],
        outcome=CODEC.encode("EpisodeOutcome", fields) if complete else None,
        outcome_fields=fields if complete else None,
        policy_version=1,
        timestamp_ms=0,
        incomplete_reason=None if complete else "no outcome after 600 s",
    )
    return CODEC.encode("Trajectory", record)


def local_store(tmp_path: Path) -> ArtifactStore:
    return open_store(LocalStoreConfig(path=tmp_path / "store"))


def produce(bus: Bus, topic: str, values: list[tuple[str, bytes]]) -> None:
    with bus.producer() as producer:
        for key, value in values:
            producer.produce(topic, value, key=key.encode())
        producer.flush()


def policy_versions(bus: Bus, run_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    with bus.consumer([POLICY_VERSIONS], group=None, start="earliest") as consumer:
        for _ in range(3):
            for record in consumer.poll(timeout_s=1.0):
                decoded = CODEC.decode(record.value).record
                if decoded["run_id"] == run_id:
                    found.append(decoded)
    return found


def trainer_config(run_id: str, topic: str, max_steps: int) -> ValueTrainerConfig:
    return ValueTrainerConfig(
        run_id=run_id,
        topic=topic,
        group=f"{topic}-value",
        value_model=ValueModelConfig(model="tiny-llama-micro", max_length=64),
        batch_size=8,
        learning_rate=1e-3,
        publish_every=2,
        checkpoint_every=2,
        max_steps=max_steps,
    )


def test_value_trainer_consumes_trajectories_publishes_versions_and_resumes_from_its_checkpoint(
    bus: Bus, tmp_path: Path, unique_name: Callable[[str], str]
) -> None:
    run_id, topic = unique_name("run"), unique_name("trajectories")
    bus.create_topic(topic, partitions=2)
    bus.create_topic(POLICY_VERSIONS, partitions=1, exist_ok=True)
    store = local_store(tmp_path)
    skipped = [
        ("ep-incomplete", trajectory_bytes(run_id, "ep-incomplete", True, seed=1, complete=False)),
        ("ep-other-run", trajectory_bytes("another-run", "ep-other-run", True, seed=2)),
        ("ep-garbage", b"not an avro record"),
    ]
    first = [(f"ep-{i}", trajectory_bytes(run_id, f"ep-{i}", i % 2 == 0, seed=100 + i)) for i in range(36)]
    produce(bus, topic, skipped + first)

    trainer = run_value_trainer(
        bus, store, trainer_config(run_id, topic, max_steps=4), scratch_dir=tmp_path / "work", max_idle_polls=5
    )

    assert (trainer.step, trainer.version, trainer.skipped) == (4, 2, 3)
    assert store.list_versions(f"runs/{run_id}/value") == [1, 2]
    records = policy_versions(bus, run_id)
    assert [(r["model"], r["version"], r["trainer_step"]) for r in records] == [("value", 1, 2), ("value", 2, 4)]
    manifest_bytes = store.get_bytes(manifest_key(f"runs/{run_id}/value", 2))
    assert records[1]["sha256"] == hashlib.sha256(manifest_bytes).hexdigest()
    store.download_version(f"runs/{run_id}/value", 2, tmp_path / "v2")
    published = ValueModel.load(tmp_path / "v2")
    probe = [np.arange(5, 40)]
    np.testing.assert_array_equal(published.predict(probe), trainer.model.predict(probe))
    checkpoints = CheckpointStore(store, run_id, "value", tmp_path / "scratch")
    assert checkpoints.latest_step() == 4
    # 32 of the 36 good trajectories were trained; the 4 still buffered are not covered by the checkpoint's offsets.
    trained_up_to = sum(trainer.offsets[topic].values())
    assert len(skipped) + 32 <= trained_up_to < len(skipped) + len(first)

    second = [(f"ep-{i}", trajectory_bytes(run_id, f"ep-{i}", i % 2 == 0, seed=100 + i)) for i in range(36, 40)]
    produce(bus, topic, second)
    resumed = run_value_trainer(
        bus, store, trainer_config(run_id, topic, max_steps=5), scratch_dir=tmp_path / "work", max_idle_polls=5
    )

    # Exactly 4 buffered + 4 new trajectories make the fifth batch: nothing was trained twice or skipped.
    assert (resumed.step, resumed.version) == (5, 3)
    end = bus.describe_topic(topic).end_offsets
    assert resumed.offsets[topic] == {p: end[p] for p in end if end[p] > 0}
    assert store.list_versions(f"runs/{run_id}/value") == [1, 2, 3]


def test_value_trainer_without_a_full_batch_publishes_nothing(
    bus: Bus, tmp_path: Path, unique_name: Callable[[str], str]
) -> None:
    run_id, topic = unique_name("run"), unique_name("trajectories")
    bus.create_topic(topic, partitions=1)
    produce(bus, topic, [(f"ep-{i}", trajectory_bytes(run_id, f"ep-{i}", True, seed=i)) for i in range(3)])
    store = local_store(tmp_path)

    trainer = run_value_trainer(
        bus, store, trainer_config(run_id, topic, max_steps=1), scratch_dir=tmp_path / "work", max_idle_polls=2
    )

    assert (trainer.step, trainer.version) == (0, 0)
    assert store.list_versions(f"runs/{run_id}/value") == []


def invoke(config_file: Path, *args: str) -> Result:
    """Run the commands in-process (the ``quiet_logging`` fixture keeps structlog off the runner's streams)."""
    return CliRunner().invoke(cli_app(), ["--config", str(config_file), *args])


@pytest.fixture
def quiet_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI configures structlog once per process with the stream of the moment; in-process runs close theirs."""
    monkeypatch.setattr("orchard.cli.common.configure_logging", lambda *args, **kwargs: None)


def cli_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main(ctx: typer.Context, config: Path = typer.Option(..., "--config")) -> None:
        ctx.obj = CliState(config_path=config)

    app.command("value")(value)
    app.command("eval")(eval_rerank)
    return app


@pytest.fixture
def config_file(tmp_path: Path, quiet_logging: None) -> Path:
    path = tmp_path / "orchard.yaml"
    settings = {
        "run_id": "cli-run",
        "bus": {"type": "embedded", "path": str(tmp_path / "bus")},
        "store": {"type": "local", "path": str(tmp_path / "store")},
        "log_format": "json",
    }
    path.write_text(yaml.safe_dump(settings))
    return path


def test_cli_train_value_publishes_versions_and_eval_rerank_uses_the_latest(config_file: Path, tmp_path: Path) -> None:
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        bus.create_topic(TRAJECTORIES, partitions=1)
        records = [(f"ep-{i}", trajectory_bytes("cli-run", f"ep-{i}", i % 2 == 0, seed=i)) for i in range(16)]
        produce(bus, TRAJECTORIES, records)
    options = ["--model", "tiny-llama-micro", "--batch-size", "8", "--max-length", "64", "--publish-every", "1"]

    trained = invoke(config_file, "value", *options, "--max-steps", "2")

    assert trained.exit_code == 0, trained.output
    assert "value trainer: step 2, version 2, skipped 0" in trained.output
    assert (tmp_path / "store" / "runs" / "cli-run" / "value" / "v0000000002" / "manifest.json").is_file()

    marker = build_tiny_tokenizer().encode("All tests passed.")
    rows = [
        {"task_id": "t", "candidate_id": "a", "token_ids": [7, 8, 9, 10], "success": False},
        {"task_id": "t", "candidate_id": "b", "token_ids": [7, 8, *marker], "success": True},
        {"task_id": "u", "candidate_id": "c", "text": "diff --git a/x b/x", "success": True},
    ]
    source = tmp_path / "candidates.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    picks = tmp_path / "picks.jsonl"

    evaluated = invoke(config_file, "eval", "--rerank", "2", "--source", str(source), "-o", str(picks))

    assert evaluated.exit_code == 0, evaluated.output
    assert "reranked 2 tasks, K=2, from 3 candidates" in evaluated.output
    assert "value model runs/cli-run/value v2" in evaluated.output
    lines = [json.loads(line) for line in picks.read_text().splitlines()]
    assert [(line["task_id"], line["candidate_id"]) for line in lines][1] == ("u", "c")
    assert all(0.0 <= line["score"] <= 1.0 for line in lines)

    from_topic = invoke(config_file, "eval", "-k", "4", "--topic", TRAJECTORIES)

    assert from_topic.exit_code == 0, from_topic.output
    assert "reranked 1 tasks, K=4, from 16 candidates" in from_topic.output


def test_cli_eval_rerank_needs_exactly_one_source(config_file: Path) -> None:
    result = invoke(config_file, "eval", "--rerank", "2")

    assert result.exit_code != 0
    assert "give exactly one of --source" in str(result.exception)


def test_value_trainer_leaving_on_idle_publishes_and_checkpoints_its_last_steps(
    bus: Bus, tmp_path: Path, unique_name: Callable[[str], str]
) -> None:
    run_id, topic = unique_name("run"), unique_name("trajectories")
    bus.create_topic(topic, partitions=1)
    produce(bus, topic, [(f"ep-{i}", trajectory_bytes(run_id, f"ep-{i}", i % 2 == 0, seed=i)) for i in range(24)])
    store = local_store(tmp_path)

    trainer = run_value_trainer(
        bus, store, trainer_config(run_id, topic, max_steps=50), scratch_dir=tmp_path / "work", max_idle_polls=2
    )

    assert (trainer.step, trainer.version) == (3, 2)  # published at step 2 (cadence), then at 3 on leaving
    assert [r["trainer_step"] for r in policy_versions(bus, run_id)] == [2, 3]
    assert CheckpointStore(store, run_id, "value", tmp_path / "scratch").latest_step() == 3


def test_a_value_model_from_the_policy_starts_from_its_newest_published_weights(
    bus: Bus, tmp_path: Path, unique_name: Callable[[str], str]
) -> None:
    from safetensors.torch import load_file

    from orchard.artifacts import policy_artifact_name
    from orchard.engines.tiny import build_tiny_checkpoint
    from trainers.exceptions import TrainerError
    from trainers.value_trainer import initial_value_model
    from trainers.weights import publish_policy_version

    run_id = unique_name("run")
    store = local_store(tmp_path)
    config = trainer_config(run_id, "unused", max_steps=1)
    config = config.model_copy(update={"value_model": ValueModelConfig(model="policy:tiny-llama", max_length=64)})
    with pytest.raises(TrainerError, match="has published no version of policy 'tiny-llama'"):
        initial_value_model(config, store, tmp_path / "work")
    bus.create_topic(POLICY_VERSIONS, partitions=1, exist_ok=True)
    with bus.producer() as producer:
        for version, seed in ((1, 1), (2, 2)):  # the newest (seed 2) is the backbone
            checkpoint = build_tiny_checkpoint("tiny-llama-micro", tmp_path / f"policy-v{version}", seed=seed)
            files = {p.name: p for p in checkpoint.iterdir() if p.is_file()}
            publish_policy_version(store, producer, run_id=run_id, model="tiny-llama", version=version, files=files,
                                   trainer_step=version)  # fmt: skip
        producer.flush()
    assert store.latest_version(policy_artifact_name(run_id, "tiny-llama")) == 2

    model = initial_value_model(config, store, tmp_path / "work")

    policy = load_file(tmp_path / "policy-v2" / "model.safetensors")
    backbone = model.backbone.state_dict()
    shared = [k for k in policy if k.removeprefix("model.") in backbone]
    assert len(shared) > 5 and all(torch.equal(policy[k], backbone[k.removeprefix("model.")]) for k in shared)
    fresh = ValueModel.build(ValueModelConfig(model="tiny-llama-micro", max_length=64))
    assert not torch.equal(fresh.backbone.embed_tokens.weight, model.backbone.embed_tokens.weight)


def _complete_config(run_id: str, topic: str) -> ValueTrainerConfig:
    return trainer_config(run_id, topic, max_steps=100).model_copy(update={"input": "complete", "group": None})


def test_a_complete_input_trains_the_same_sorted_pass_whatever_the_bus_order_and_resumes_mid_pass(
    bus: Bus, tmp_path: Path, unique_name: Callable[[str], str]
) -> None:
    """``input: complete``: 20 trajectories (3 steps of 8, the last of 4) in two bus orders give the same weights; a
    trainer stopped after its step-2 checkpoint resumes at the same example and ends with them too."""
    import threading

    from trainers.value_trainer import ValueTrainer

    run_id = unique_name("run")
    good = [(f"ep-{i:02d}", trajectory_bytes(run_id, f"ep-{i:02d}", i % 3 == 0, seed=200 + i)) for i in range(20)]
    weights = {}
    for order, values in (("forward", good), ("backward", good[::-1]), ("stopped", good)):
        topic = unique_name(f"trajectories-{order}")
        bus.create_topic(topic, partitions=2)
        bus.create_topic(POLICY_VERSIONS, partitions=1, exist_ok=True)
        produce(bus, topic, [("ep-garbage", b"not an avro record"), *values])
        store = open_store(LocalStoreConfig(path=tmp_path / order / "store"))
        config = _complete_config(run_id, topic)
        stop = threading.Event()
        if order == "stopped":

            class StopsAfterTwo(ValueTrainer):
                def train_batch(self, batch: list[Any], stop: threading.Event = stop) -> float:
                    loss = super().train_batch(batch)
                    if self.step == 2:
                        stop.set()
                    return loss

            first = StopsAfterTwo(config, ValueModel.build(config.value_model))
            run_value_trainer(bus, store, config, scratch_dir=tmp_path / order / "a", stop=stop, trainer=first)
            assert (first.step, first.pass_position) == (2, 16)
        trainer = run_value_trainer(bus, store, config, scratch_dir=tmp_path / order / "b")
        assert (trainer.step, trainer.skipped, trainer.pass_position, trainer.input_end) == (3, 1, 0, None)
        end = bus.describe_topic(topic).end_offsets
        assert trainer.offsets[topic] == {p: end[p] for p in end}
        weights[order] = trainer.model.state_dict()
        assert [v["trainer_step"] for v in policy_versions(bus, run_id) if v["model"] == "value"][-1] == 3
        store.close()
    for order in ("backward", "stopped"):
        assert all(torch.equal(weights["forward"][name], weights[order][name]) for name in weights["forward"])
