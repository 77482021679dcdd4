"""The policy trainer on real buses and stores: staleness, crash and exact resume, engines picking up versions.

- stale samples are dropped or down-weighted as configured (embedded bus, local store);
- ``orchard train policy`` in its own process, SIGKILLed after a checkpoint (with steps and a publication after it),
  restarted: it resumes from the checkpoint's offsets and ends with weights bitwise equal to an uninterrupted run's
  (deterministic torch, one thread, CPU);
- a version the trainer publishes is loaded by a running local engine (``PolicyReloader``), which then serves it;
- on the real Kafka broker and S3 store, the trainer consumes samples and publishes a version.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from orchard.artifacts import policy_artifact_name
from orchard.bus import open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig, KafkaBusConfig, LocalStoreConfig, OrchardConfig, S3StoreConfig
from orchard.engines.local import LocalEngine
from orchard.engines.openai_api import create_engine_app
from orchard.engines.reload import PolicyReloader
from orchard.engines.server import serve_in_thread
from orchard.engines.tiny import build_tiny_checkpoint
from orchard.engines.token_trace import trace_of
from orchard.store import open_store
from orchard.tokens import pack_logprobs
from orchard.topics import POLICY_VERSIONS
from trainers.checkpoint import CheckpointStore
from trainers.config import PolicyTrainerConfig, StalenessConfig
from trainers.policy import PolicyTrainer
from trainers.synthetic import produce_samples, synthetic_sample, synthetic_stream

MODEL = "tiny-llama-micro"
TINY_VOCAB = 420
REPO = Path(__file__).resolve().parents[2]


def _orchard(root: Path, run_id: str = "r1") -> OrchardConfig:
    return OrchardConfig(
        run_id=run_id, bus=EmbeddedBusConfig(path=root / "bus"), store=LocalStoreConfig(path=root / "store")
    )


def _trainer_config(root: Path, **overrides: Any) -> PolicyTrainerConfig:
    base: dict[str, Any] = {
        "run_dir": root / "run",
        "batch_tokens": 256,
        "lr": 1e-3,
        "publish_every": 2,
        "checkpoint_every": 4,
        "idle_flush_s": 0.2,
        "idle_exit_s": 1.0,
        "poll_timeout_s": 0.1,
        "cpu_threads": 1,
    }
    return PolicyTrainerConfig.model_validate(base | overrides)


def _version_records(bus_path: Path) -> list[dict[str, Any]]:
    with open_bus(EmbeddedBusConfig(path=bus_path)) as bus, bus.consumer([POLICY_VERSIONS]) as consumer:
        records = consumer.poll(max_records=100, timeout_s=1.0)
    return [Codec.default().decode(r.value).record for r in records]


# ---------------------------------------------------------------------------------------------------- staleness
@pytest.mark.parametrize("policy", ["drop", "downweight"])
def test_stale_samples_are_dropped_or_downweighted_as_configured(tmp_path: Path, policy: str) -> None:
    orchard = _orchard(tmp_path)
    # the trainer starts at version 6; samples from versions 6, 5, 4 (lag <= 2) and 1, 0 (lag 5, 6)
    versions = [6, 5, 1, 4, 0, 6, 1, 5]
    records = [synthetic_sample(i, run_id="r1", vocab_size=TINY_VOCAB, length=40) for i in range(len(versions))]
    for record, version in zip(records, versions, strict=True):
        record["policy_version"] = version
    with open_bus(orchard.bus) as bus:
        produce_samples(bus, "samples", records)
    config = _trainer_config(
        tmp_path,
        initial_version=6,
        batch_tokens=4096,
        publish_on_exit=False,
        staleness=StalenessConfig(max_policy_lag=2, policy=policy, decay=0.5),
    )
    trainer = PolicyTrainer(config, orchard)
    summary = trainer.run()

    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and metrics[0]["policy_lag_max"] == 6
    exported = trainer.metrics.render().decode()
    if policy == "drop":
        assert (summary.samples, metrics[0]["samples_dropped_stale"]) == (5, 3)
        assert 'orchard_trainer_samples_dropped_stale_total{model="policy",run_id="r1"} 3.0' in exported
    else:
        assert (summary.samples, metrics[0]["samples_downweighted_stale"]) == (8, 3)
        assert 'orchard_trainer_samples_downweighted_stale_total{model="policy",run_id="r1"} 3.0' in exported
    assert summary.offsets == {} and trainer.consumed == {"samples": {0: 8}}  # no checkpoint: publish_on_exit off
    resolved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert resolved["trainer"]["staleness"]["policy"] == policy and resolved["run_id"] == "r1"


@pytest.mark.parametrize(("skip", "kl_coef", "trained"), [(True, 0.0, 4), (False, 0.0, 6), (True, 0.1, 6)])
def test_rl_samples_with_only_zero_advantages_are_skipped_and_counted_when_asked_and_no_kl_term_needs_them(
    tmp_path: Path, skip: bool, kl_coef: float, trained: int
) -> None:
    orchard = _orchard(tmp_path)
    records = [synthetic_sample(i, run_id="r1", vocab_size=TINY_VOCAB, length=40) for i in range(6)]
    for index in (1, 4):  # a uniform group's samples: every advantage 0
        records[index]["advantages"] = pack_logprobs(np.zeros(40, dtype=np.float32))
    with open_bus(orchard.bus) as bus:
        produce_samples(bus, "samples", records)
    config = _trainer_config(tmp_path, batch_tokens=4096, publish_on_exit=False, loss={"kind": "rl",
                             "skip_zero_advantage": skip, "kl_coef": kl_coef})  # fmt: skip
    trainer = PolicyTrainer(config, orchard)
    summary = trainer.run()

    assert summary.samples == trained and trainer.consumed == {"samples": {0: 6}}
    exported = trainer.metrics.render().decode()
    skipped = 'orchard_trainer_samples_skipped_zero_advantage_total{model="policy",run_id="r1"} 2.0'
    assert (skipped in exported) == (trained == 4)


def test_records_that_are_not_valid_samples_are_dead_lettered_and_skipped(tmp_path: Path) -> None:
    orchard = _orchard(tmp_path)
    good = synthetic_stream(3, run_id="r1", vocab_size=TINY_VOCAB, lengths=(30,))
    bad = synthetic_sample(9, run_id="r1", vocab_size=TINY_VOCAB, length=30)
    bad["loss_mask"] = bad["loss_mask"][:10]
    out_of_vocab = synthetic_sample(10, run_id="r1", vocab_size=5000, length=30, seed=4)
    with open_bus(orchard.bus) as bus:
        produce_samples(bus, "samples", [good[0], bad, good[1], out_of_vocab, good[2]])
        with bus.producer() as producer:
            producer.send("samples", b"not an avro record")
    summary = PolicyTrainer(_trainer_config(tmp_path, batch_tokens=4096), orchard).run()
    assert (summary.steps, summary.samples, summary.offsets) == (1, 3, {"samples": {0: 6}})
    with open_bus(orchard.bus) as bus, bus.consumer(["dead-letters"]) as consumer:
        letters = [Codec.default().decode(r.value).record for r in consumer.poll(max_records=10, timeout_s=1.0)]
    assert sorted((letter["source_offset"], letter["error_type"]) for letter in letters) == [
        (1, "InvalidSampleError"),
        (5, "CorruptRecordError"),
    ]


# ---------------------------------------------------------------------------------------------------- crash/resume
def _cli_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")}
    env |= {
        "ORCHARD_RUN_ID": "r1",
        "ORCHARD_BUS__TYPE": "embedded",
        "ORCHARD_BUS__PATH": str(root / "bus"),
        "ORCHARD_STORE__TYPE": "local",
        "ORCHARD_STORE__PATH": str(root / "store"),
        "ORCHARD_LOG_FORMAT": "json",
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
    }
    return env


def _start_cli(root: Path, config_file: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-c", "from orchard.cli.main import run; run()", "train", "policy"]
    log = open(root / f"trainer-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115 - owned by the process
    return subprocess.Popen([*command, "--config", str(config_file)], env=_cli_env(root), stdout=log, stderr=log)


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _log_events(root: Path, event: str) -> list[dict[str, Any]]:
    found = []
    for path in sorted(root.glob("trainer-*.log")):
        for line in path.read_text().splitlines():
            if line.startswith('{"') and json.loads(line).get("event") == event:
                found.append(json.loads(line))
    return found


def _log_tail(root: Path) -> str:
    return "\n".join(p.read_text()[-3000:] for p in sorted(root.glob("trainer-*.log")))


def _weights(store_root: Path, version: int) -> dict[str, torch.Tensor]:
    path = store_root / policy_artifact_name("r1", "policy") / f"v{version:010d}" / "model.safetensors"
    return load_file(path)


@pytest.mark.slow
def test_a_killed_trainer_resumes_from_its_checkpoint_and_ends_with_the_same_weights(tmp_path: Path) -> None:
    stream = synthetic_stream(90, run_id="r1", kinds=("RL", "SFT"), vocab_size=TINY_VOCAB, seed=5)
    settings = {
        "model": {"type": "tiny", "name": MODEL, "seed": 1},
        "batch_tokens": 256,
        "grad_accum": 2,
        "lr": 1e-3,
        "publish_every": 2,
        "checkpoint_every": 4,
        "max_steps": 10,
        "idle_flush_s": 3600,  # only full steps: their composition depends on the data alone
        "staleness": {"max_policy_lag": 2, "policy": "downweight"},
        "deterministic": True,
        "cpu_threads": 1,
        "seed": 3,
    }
    runs = {}
    for name in ("uninterrupted", "killed"):
        root = tmp_path / name
        root.mkdir()
        (root / "trainer.yaml").write_text(json.dumps(settings | {"run_dir": str(root / "run")}))
        runs[name] = root
    with open_bus(EmbeddedBusConfig(path=runs["uninterrupted"] / "bus")) as bus:
        produce_samples(bus, "samples", stream)
    with open_bus(EmbeddedBusConfig(path=runs["killed"] / "bus")) as bus:
        produce_samples(bus, "samples", stream[:45])  # 7 full steps, not 8: checkpoint at 4, version 3 at 6

    reference = _start_cli(runs["uninterrupted"], runs["uninterrupted"] / "trainer.yaml")
    killed = runs["killed"]
    first = _start_cli(killed, killed / "trainer.yaml")
    store = open_store(LocalStoreConfig(path=killed / "store"))
    checkpoints = CheckpointStore(store, "r1", "policy", tmp_path / "scratch")
    _wait(
        # version 3 both in the store and announced on the bus, so the kill lands after it and the restart
        # (which resumes at the step-4 checkpoint) announces it a second time
        lambda: (
            (
                store.latest_version(policy_artifact_name("r1", "policy")) == 3
                and 3 in [r["version"] for r in _version_records(killed / "bus")]
            )
            or first.poll() is not None
        ),
        120,
        "version 3 (step 6)",
    )
    assert first.poll() is None, _log_tail(killed)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert checkpoints.latest_step() == 4  # steps 5 and 6 (and version 3) came after the last checkpoint
    saved = checkpoints.load_latest()
    assert saved is not None

    with open_bus(EmbeddedBusConfig(path=killed / "bus")) as bus:
        produce_samples(bus, "samples", stream[45:])
    second = _start_cli(killed, killed / "trainer.yaml")
    assert second.wait(timeout=180) == 0, _log_tail(killed)
    assert reference.wait(timeout=180) == 0, _log_tail(runs["uninterrupted"])

    resumed = _log_events(killed, "resumed")
    assert [(e["step"], e["offsets"]) for e in resumed] == [(4, {"samples": {"0": saved.state.offsets["samples"][0]}})]
    assert len(_log_events(killed, "version already published by an earlier run of this trainer; keeping it and "
                                    "announcing it again")) == 1  # fmt: skip
    final = {name: CheckpointStore(open_store(LocalStoreConfig(path=root / "store")), "r1", "policy", tmp_path / "s")
             for name, root in runs.items()}  # fmt: skip
    ends = {name: c.load_latest() for name, c in final.items()}
    assert ends["killed"] is not None and ends["uninterrupted"] is not None
    assert ends["killed"].state.step == ends["uninterrupted"].state.step == 10
    assert ends["killed"].state.offsets == ends["uninterrupted"].state.offsets
    for key, tensor in ends["uninterrupted"].tensors["model"].items():
        assert torch.equal(ends["killed"].tensors["model"][key], tensor), key
    for version in range(1, 6):  # every published version, including the one published before the kill
        a, b = _weights(runs["uninterrupted"] / "store", version), _weights(killed / "store", version)
        assert all(torch.equal(a[k], b[k]) for k in a), version
    versions = [r["version"] for r in _version_records(killed / "bus")]
    assert versions == [1, 2, 3, 3, 4, 5]  # version 3 announced again after the restart


# ---------------------------------------------------------------------------------------------------- engine
def test_a_published_version_is_picked_up_by_a_running_engine(tmp_path: Path) -> None:
    orchard = _orchard(tmp_path)
    checkpoint = build_tiny_checkpoint(MODEL, tmp_path / "checkpoint", seed=0)  # the trainer's starting weights
    bus, store = open_bus(orchard.bus), open_store(orchard.store)
    engine = LocalEngine(checkpoint, model_name=MODEL, max_batch_size=4, cpu_threads=1)
    reloader = PolicyReloader(engine, bus, store, run_id="r1", model="policy", poll_timeout_s=0.1)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    try:
        with serve_in_thread(create_engine_app(engine, reloader=reloader)) as url, httpx.Client(base_url=url) as http:
            before = http.post("/v1/chat/completions", json=body, timeout=60).json()
            produce_samples(bus, "samples", synthetic_stream(8, run_id="r1", vocab_size=TINY_VOCAB, lengths=(40,)))
            config = _trainer_config(tmp_path, max_steps=2, publish_every=2, batch_tokens=160)
            summary = PolicyTrainer(config, orchard, bus=bus, store=store).run()
            _wait(lambda: engine.policy_version == 1, 60, "the engine to load version 1")
            after = http.post("/v1/chat/completions", json=body, timeout=60).json()
    finally:
        bus.close()
        store.close()
    assert summary.published == [1]
    assert (_trace_version(before), _trace_version(after)) == (0, 1)
    assert reloader.applied == [1] and reloader.refused == []


def _trace_version(response: dict[str, Any]) -> int:
    trace = trace_of(response) or trace_of(response["choices"][0])
    assert trace is not None, response
    return trace.policy_version


# ---------------------------------------------------------------------------------------------------- kafka + s3
@pytest.mark.kafka
@pytest.mark.s3
def test_trainer_consumes_samples_from_kafka_and_publishes_a_version_to_s3(
    tmp_path: Path, kafka_bootstrap: str, s3_service: Any, unique_name: Callable[[str], str]
) -> None:
    run_id, topic = unique_name("run"), unique_name("samples")
    orchard = OrchardConfig(
        run_id=run_id,
        bus=KafkaBusConfig(bootstrap_servers=kafka_bootstrap),
        store=S3StoreConfig(
            endpoint=s3_service.endpoint,
            bucket=unique_name("trainer"),
            access_key=s3_service.access_key,
            secret_key=s3_service.secret_key,
        ),
    )
    bus, store = open_bus(orchard.bus), open_store(orchard.store)
    try:
        produce_samples(bus, topic, synthetic_stream(6, run_id=run_id, vocab_size=TINY_VOCAB, lengths=(40,)))
        config = _trainer_config(
            tmp_path, topic=topic, group_id=unique_name("trainer"), max_steps=1, batch_tokens=1024, idle_exit_s=20.0
        )
        summary = PolicyTrainer(config, orchard, bus=bus, store=store).run()
        versions = store.list_versions(policy_artifact_name(run_id, "policy"))
        checkpoint = CheckpointStore(store, run_id, "policy", tmp_path / "scratch").load_latest()
        with bus.consumer([POLICY_VERSIONS]) as consumer:
            announced = []
            deadline = time.monotonic() + 30
            while not announced and time.monotonic() < deadline:
                records = [Codec.default().decode(r.value).record for r in consumer.poll(500, timeout_s=1.0)]
                announced = [r for r in records if r["run_id"] == run_id]
    finally:
        bus.close()
        store.close()
    assert (summary.steps, summary.samples, summary.published) == (1, 6, [1])
    assert versions == [1]
    assert checkpoint is not None and checkpoint.state.offsets == {topic: {0: 6}}
    assert [(r["version"], r["trainer_step"], r["uri"].startswith("s3://")) for r in announced] == [(1, 1, True)]


# ---------------------------------------------------------------------------------------------------- epochs
def test_with_two_epochs_the_trainer_takes_twice_the_steps_over_the_same_samples(tmp_path: Path) -> None:
    orchard = _orchard(tmp_path)
    with open_bus(orchard.bus) as bus:
        produce_samples(bus, "samples", synthetic_stream(10, run_id="r1", vocab_size=TINY_VOCAB, lengths=(40,)))
    config = _trainer_config(tmp_path, batch_tokens=160, epochs=2, checkpoint_every=100)  # 4 samples a step
    summary = PolicyTrainer(config, orchard).run()

    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["samples"] for m in metrics] == [4, 4, 2, 4, 4, 2]  # the replay flushes its last step at its end
    assert (summary.steps, summary.samples, summary.epochs, summary.offsets) == (6, 20, 2, {"samples": {0: 10}})
    store = open_store(orchard.store)
    end = CheckpointStore(store, "r1", "policy", tmp_path / "scratch").load_latest()
    assert end is not None  # between stages: the next trainer starts its own stage at the offsets
    assert (end.state.step, end.state.epoch, end.state.epoch_start, end.state.epoch_end) == (6, 0, None, None)

    # the next stage (same run and model name) resumes there and passes twice over its own samples only
    with open_bus(orchard.bus) as bus:
        produce_samples(bus, "samples", synthetic_stream(4, run_id="r1", vocab_size=TINY_VOCAB, lengths=(40,), seed=9))
    summary = PolicyTrainer(config.model_copy(update={"run_dir": tmp_path / "run2"}), orchard, store=store).run()
    assert (summary.resumed_from_step, summary.steps, summary.samples) == (6, 8, 20 + 8)  # counters carry on
    assert (summary.epochs, summary.offsets) == (2, {"samples": {0: 14}})


class _Crash(Exception):
    """Stands for the process dying in the middle of a step."""


def test_a_trainer_stopped_in_a_replayed_epoch_resumes_that_epoch_and_ends_with_the_same_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = synthetic_stream(10, run_id="r1", vocab_size=TINY_VOCAB, lengths=(40,), seed=2)
    settings = {"batch_tokens": 160, "epochs": 3, "checkpoint_every": 1, "model": {"type": "tiny", "name": MODEL}}
    ends = {}
    for name in ("uninterrupted", "crashed"):
        root = tmp_path / name
        orchard = _orchard(root)
        with open_bus(orchard.bus) as bus:
            produce_samples(bus, "samples", stream)
        config = _trainer_config(root, **settings)
        if name == "crashed":

            def crash_at_step_5(self: PolicyTrainer, step: Any, train: Any = PolicyTrainer._train) -> None:
                if self.step == 4:  # epoch 1 (steps 4-6), after its first step's checkpoint
                    raise _Crash
                train(self, step)

            monkeypatch.setattr(PolicyTrainer, "_train", crash_at_step_5)
            with pytest.raises(_Crash):
                PolicyTrainer(config, orchard).run()
            monkeypatch.undo()
            saved = CheckpointStore(open_store(orchard.store), "r1", "policy", tmp_path / "s").load_latest()
            assert saved is not None
            assert (saved.state.step, saved.state.epoch, saved.state.offsets) == (4, 1, {"samples": {0: 4}})
            assert (saved.state.epoch_start, saved.state.epoch_end) == ({"samples": {0: 0}}, {"samples": {0: 10}})
        summary = PolicyTrainer(config, orchard).run()
        assert (summary.steps, summary.offsets) == (9, {"samples": {0: 10}})
        end = CheckpointStore(open_store(orchard.store), "r1", "policy", tmp_path / "s").load_latest()
        assert end is not None and (end.state.step, end.state.epoch) == (9, 0)
        ends[name] = end.tensors["model"]
    for key, tensor in ends["uninterrupted"].items():
        assert torch.equal(ends["crashed"][key], tensor), key


# ---------------------------------------------------------------------------------------------------- KL reference
def test_the_kl_reference_of_a_resumed_stage_is_the_weights_it_started_from_even_after_a_restart(
    tmp_path: Path,
) -> None:
    orchard = _orchard(tmp_path)
    with open_bus(orchard.bus) as bus:
        produce_samples(bus, "samples", synthetic_stream(8, run_id="r1", kinds=("SFT",), vocab_size=TINY_VOCAB))
    sft = PolicyTrainer(_trainer_config(tmp_path, max_steps=4, publish_on_exit=True), orchard)
    sft.run()
    sft_weights = CheckpointStore(open_store(orchard.store), "r1", "policy", tmp_path / "s").load_latest()
    assert sft_weights is not None
    started_from = {k: v.clone() for k, v in sft_weights.tensors["model"].items()}
    with open_bus(orchard.bus) as bus:  # the RL stage's samples, after the SFT ones
        records = synthetic_stream(8, run_id="r1", kinds=("RL",), vocab_size=TINY_VOCAB, seed=3)
        produce_samples(bus, "samples", records)
    rl_config = _trainer_config(tmp_path, max_steps=6, loss={"kind": "rl", "kl_coef": 0.1})
    rl = PolicyTrainer(rl_config, orchard)
    rl.run()  # restores the SFT checkpoint, trains, checkpoints with its reference
    assert rl.reference is not None
    assert all(torch.equal(rl.reference.state_dict()[k], v) for k, v in started_from.items())  # not the seed's weights
    again = PolicyTrainer(_trainer_config(tmp_path, max_steps=7, loss={"kind": "rl", "kl_coef": 0.1}), orchard)
    again.run()  # restarted from the RL stage's own checkpoint: the reference is still where the stage began
    assert again.reference is not None
    latest = CheckpointStore(open_store(orchard.store), "r1", "policy", tmp_path / "s").load_latest()
    assert latest is not None
    assert not torch.equal(latest.tensors["model"]["lm_head.weight"], started_from["lm_head.weight"])
    assert all(torch.equal(again.reference.state_dict()[k], v) for k, v in started_from.items())


@pytest.mark.parametrize("stage_optimizer", ["keep", "fresh"])
def test_a_next_stage_keeps_or_starts_fresh_its_optimizer_and_a_restart_of_it_always_restores_it(
    tmp_path: Path, stage_optimizer: str
) -> None:
    orchard = _orchard(tmp_path)
    with open_bus(orchard.bus) as bus:
        produce_samples(bus, "samples", synthetic_stream(8, run_id="r1", kinds=("SFT",), vocab_size=TINY_VOCAB))
    PolicyTrainer(_trainer_config(tmp_path, max_steps=4), orchard).run()
    with open_bus(orchard.bus) as bus:
        produce_samples(bus, "samples", synthetic_stream(8, run_id="r1", vocab_size=TINY_VOCAB, seed=3))
    rl_dir = tmp_path / "rl"

    def rl_trainer(max_steps: int) -> PolicyTrainer:
        config = _trainer_config(tmp_path, max_steps=max_steps, run_dir=rl_dir, stage_optimizer=stage_optimizer)
        trainer = PolicyTrainer(config, orchard)
        trainer._prepare_torch()  # noqa: SLF001 - restore without training: what the stage starts from
        trainer._build_model()  # noqa: SLF001
        with open_bus(orchard.bus) as bus, bus.consumer(["samples"], group="probe") as consumer:
            trainer._restore(consumer)  # noqa: SLF001
        return trainer

    start = rl_trainer(6)
    moments = start.backend.optimizer.state_dict()["state"]  # type: ignore[attr-defined]
    assert start.step > 0 and bool(moments) == (stage_optimizer == "keep")
    rl = PolicyTrainer(_trainer_config(tmp_path, max_steps=6, run_dir=rl_dir, stage_optimizer=stage_optimizer), orchard)
    rl.run()
    restarted = rl_trainer(7)  # its own checkpoint: moments restored whatever the setting
    saved = CheckpointStore(open_store(orchard.store), "r1", "policy", tmp_path / "s").load_latest()
    assert saved is not None and saved.state.trainer == str(rl_dir.resolve())
    state = restarted.backend.optimizer.state_dict()["state"]  # type: ignore[attr-defined]
    assert state and torch.equal(state[0]["exp_avg"], saved.tensors["optimizer"]["state"][0]["exp_avg"])


# ---------------------------------------------------------------------------------------------------- export-model
def test_a_published_version_exports_with_its_tokenizer_and_loads_with_auto_classes(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    orchard = _orchard(tmp_path)
    (tmp_path / "orchard.yaml").write_text(
        f"run_id: r1\nbus: {{type: embedded, path: {tmp_path / 'bus'}}}\n"
        f"store: {{type: local, path: {tmp_path / 'store'}}}\n"
    )
    with open_bus(orchard.bus) as bus:
        produce_samples(bus, "samples", synthetic_stream(4, run_id="r1", kinds=("SFT",), vocab_size=TINY_VOCAB))
    trainer = PolicyTrainer(_trainer_config(tmp_path, model={"type": "tiny", "name": MODEL}), orchard)
    summary = trainer.run()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")}

    def export(*args: str) -> subprocess.CompletedProcess[str]:
        command = [str(Path(sys.executable).with_name("orchard")), "export-model", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    done = export(str(tmp_path), "latest", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert f"v{summary.policy_version}" in done.stdout
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "hi" in prompt and tokenizer("hi").input_ids
    trained = trainer.backend.state_tensors()["model"]
    assert all(torch.equal(value, trained[key]) for key, value in model.state_dict().items() if key in trained)

    again = export(str(tmp_path), "latest", str(tmp_path / "out"))
    assert again.returncode == 1 and "not an empty directory" in again.stderr
    missing = export(str(tmp_path), "99", str(tmp_path / "other"))
    assert missing.returncode == 1 and "VERSION must be 'latest' or one of 1.." in " ".join(missing.stderr.split())


# ---------------------------------------------------------------------------------------------------- drain
def test_sigterm_drains_the_topic_publishes_and_checkpoints_before_the_trainer_exits(tmp_path: Path) -> None:
    settings = {"model": {"type": "tiny", "name": MODEL}, "batch_tokens": 256, "publish_every": 1000,
                "checkpoint_every": 1000, "idle_flush_s": 3600, "idle_exit_s": None, "cpu_threads": 1,
                "run_dir": str(tmp_path / "run")}  # fmt: skip
    (tmp_path / "trainer.yaml").write_text(json.dumps(settings))
    stream = synthetic_stream(30, run_id="r1", vocab_size=TINY_VOCAB, seed=7)
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        produce_samples(bus, "samples", stream[:10])
    trainer = _start_cli(tmp_path, tmp_path / "trainer.yaml")
    _wait(lambda: bool(_log_events(tmp_path, "no checkpoint, starting from the initial weights")), 120, "the start")
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        produce_samples(bus, "samples", stream[10:])  # on the bus before the signal: trained before the exit
    trainer.send_signal(signal.SIGTERM)

    assert trainer.wait(timeout=120) == 0, _log_tail(tmp_path)
    assert len(_log_events(tmp_path, "drained on request, exiting")) == 1
    saved = CheckpointStore(open_store(LocalStoreConfig(path=tmp_path / "store")), "r1", "policy", tmp_path / "s")
    end = saved.load_latest()
    assert end is not None and end.state.offsets == {"samples": {0: 30}}  # every sample, the last step partial
    assert int(end.state.counters["samples"]) == 30
    assert [r["version"] for r in _version_records(tmp_path / "bus")] == [1]  # published on the way out


@pytest.mark.parametrize("publish_on_idle", [True, False])
def test_a_trainer_whose_input_runs_dry_publishes_what_it_trained_only_when_asked(
    tmp_path: Path, publish_on_idle: bool
) -> None:
    orchard = _orchard(tmp_path)
    config = _trainer_config(tmp_path, model={"type": "tiny", "name": MODEL}, publish_every=1000,
                             checkpoint_every=1000, idle_exit_s=None, publish_on_idle=publish_on_idle)  # fmt: skip
    stream = synthetic_stream(20, run_id="r1", vocab_size=TINY_VOCAB, seed=5)
    trainer = PolicyTrainer(config, orchard)
    runner = threading.Thread(target=trainer.run, daemon=True)
    runner.start()
    versions_seen: list[list[int]] = []
    for batch in (stream[:10], stream[10:]):  # two dry spells, each after a rollout round's worth of samples
        with open_bus(orchard.bus) as bus:
            produce_samples(bus, "samples", batch)
        _wait(lambda: trainer.consumed.get("samples", {}).get(0, 0) >= len(versions_seen) * 10 + 10, 120, "training")
        if publish_on_idle:
            _wait(lambda: len(_version_records(tmp_path / "bus")) > len(versions_seen), 30, "an idle publish")
        else:
            time.sleep(1.5)  # several idle_flush_s: a version would have come by now
        versions_seen.append([r["version"] for r in _version_records(tmp_path / "bus")])
    trainer.request_drain()
    runner.join(timeout=120)

    assert not runner.is_alive()
    if publish_on_idle:  # one version per dry spell, and none on the way out: nothing was trained after the second
        assert versions_seen == [[1], [1, 2]]
        assert [r["version"] for r in _version_records(tmp_path / "bus")] == [1, 2]
    else:  # publish_every 1000: only the exit publishes
        assert versions_seen == [[], []]
        assert [r["version"] for r in _version_records(tmp_path / "bus")] == [1]
