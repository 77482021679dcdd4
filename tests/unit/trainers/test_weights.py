"""Publishing a trainer's versions: the tokenizer saved once, the last version's manifest as the next one's base, the
record's sha256 that of the manifest stored, and a version already stored announced again."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest

from orchard.bus import open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig, LocalStoreConfig
from orchard.engines.tiny import build_tiny_tokenizer
from orchard.store import ArtifactStore, open_store
from orchard.store.versions import manifest_key
from orchard.topics import POLICY_VERSIONS
from trainers.weights import WeightPublisher

MODEL = "tiny"


def _exporter(calls: list[int]) -> Any:
    def export(directory: Path) -> dict[str, Path]:
        calls.append(1)
        (directory / "config.json").write_text('{"a": 1}')
        (directory / "model.safetensors").write_bytes(b"weights %d" % len(calls))
        return {p.name: p for p in sorted(directory.iterdir())}

    return export


def _records(bus_path: Path) -> list[dict[str, Any]]:
    with open_bus(EmbeddedBusConfig(path=bus_path)) as bus, bus.consumer([POLICY_VERSIONS]) as consumer:
        records = consumer.poll(max_records=100, timeout_s=1.0)
    return [Codec.default().decode(r.value).record for r in records]


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return open_store(LocalStoreConfig(path=tmp_path / "store"))


def test_versions_carry_the_tokenizer_saved_once_and_reuse_the_last_manifest_as_their_base(
    tmp_path: Path, store: ArtifactStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = build_tiny_tokenizer()
    saved: list[Path] = []
    real_save = type(tokenizer).save_pretrained
    monkeypatch.setattr(type(tokenizer), "save_pretrained", lambda self, d, **k: saved.append(d) or real_save(self, d))
    exports: list[int] = []
    publisher = WeightPublisher(store, _exporter(exports), tokenizer, scratch=tmp_path / "scratch", run_id="r",
                                model=MODEL, codec=Codec.default())  # fmt: skip
    read_back: list[int] = []
    real_read = store.read_manifest
    monkeypatch.setattr(store, "read_manifest", lambda name, v, *a: read_back.append(v) or real_read(name, v, *a))

    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus, bus.producer() as producer:
        bus.create_topic(POLICY_VERSIONS, 1, exist_ok=True)
        for version in (1, 2, 3):
            publisher.publish(producer, version=version, step=version * 10, metrics={"loss": 0.5})

    assert len(saved) == 1 and len(exports) == 3
    assert read_back == []  # each base is the manifest it published last, not read back from the store
    third = real_read(publisher.name, 3)
    assert {"tokenizer.json", "config.json", "model.safetensors"} <= {f.path for f in third.files}
    records = _records(tmp_path / "bus")
    assert [r["version"] for r in records] == [1, 2, 3]
    for record in records:
        stored = store.get_bytes(manifest_key(publisher.name, record["version"]))
        assert record["sha256"] == hashlib.sha256(stored).hexdigest()
    v1, v3 = (store.root / publisher.name / f"v{v:010d}" / "tokenizer.json" for v in (1, 3))  # type: ignore[attr-defined]
    assert v3.stat().st_ino == v1.stat().st_ino  # copied from the base inside the store, not uploaded again
    leftovers = [p.name for p in (tmp_path / "scratch").iterdir()]
    assert len(leftovers) == 1 and leftovers[0].startswith("tokenizer-")  # exports cleaned up


def test_a_restarted_publisher_reads_the_previous_manifest_and_announces_a_stored_version_again(
    tmp_path: Path, store: ArtifactStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    exports: list[int] = []
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus, bus.producer() as producer:
        bus.create_topic(POLICY_VERSIONS, 1, exist_ok=True)
        first = WeightPublisher(store, _exporter(exports), None, scratch=tmp_path / "s", run_id="r", model=MODEL,
                                codec=Codec.default())  # fmt: skip
        first.publish(producer, version=1, step=5, metrics={})
        first.publish(producer, version=2, step=9, metrics={})

        restarted = WeightPublisher(store, _exporter(exports), None, scratch=tmp_path / "s", run_id="r", model=MODEL,
                                    codec=Codec.default())  # fmt: skip
        restarted.publish(producer, version=2, step=8, metrics={})  # published before the crash: kept
        read_back: list[int] = []
        real_read = store.read_manifest
        monkeypatch.setattr(store, "read_manifest", lambda name, v, *a: read_back.append(v) or real_read(name, v, *a))
        restarted.publish(producer, version=3, step=12, metrics={})

    assert len(exports) == 3  # version 2 was not exported again
    assert read_back == [2]  # the base of version 3, read back once
    assert (
        store.read_manifest(first.name, 3).file("config.json").sha256
        == store.read_manifest(first.name, 2).file("config.json").sha256
    )
    assert [(r["version"], r["trainer_step"]) for r in _records(tmp_path / "bus")] == [(1, 5), (2, 9), (2, 9), (3, 12)]


def test_a_tokenizer_whose_saved_files_were_cleaned_away_is_saved_again(tmp_path: Path, store: ArtifactStore) -> None:
    publisher = WeightPublisher(store, _exporter([]), build_tiny_tokenizer(), scratch=tmp_path / "scratch",
                                run_id="r", model=MODEL, codec=Codec.default())  # fmt: skip
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus, bus.producer() as producer:
        bus.create_topic(POLICY_VERSIONS, 1, exist_ok=True)
        publisher.publish(producer, version=1, step=1, metrics={})
        shutil.rmtree(tmp_path / "scratch")
        publisher.publish(producer, version=2, step=2, metrics={})

    assert "tokenizer.json" in {f.path for f in store.read_manifest(publisher.name, 2).files}
