"""One conformance suite for every store backend: a local directory and a real S3 server (SeaweedFS)."""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from minio import Minio
from minio.deleteobjects import DeleteObject

from orchard.config import LocalStoreConfig, S3StoreConfig
from orchard.store import (
    ArtifactNotFoundError,
    ArtifactStore,
    IntegrityError,
    InvalidKeyError,
    ObjectInfo,
    SourceReadError,
    VersionExistsError,
    open_store,
)

MIB = 1024 * 1024


class CutOffReader:
    """A source that yields ``fail_after`` bytes and then raises, like a producer dying mid-upload."""

    def __init__(self, fail_after: int) -> None:
        self.remaining = fail_after

    def read(self, size: int = -1) -> bytes:
        if self.remaining <= 0:
            raise ConnectionResetError("producer died mid-upload")
        n = self.remaining if size < 0 else min(size, self.remaining)
        self.remaining -= n
        return b"\xab" * n


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def drop_bucket(service: Any, bucket: str) -> None:
    """Delete a test bucket and its objects, which also frees the server's volumes for the next test."""
    client = Minio(service.endpoint, service.access_key, service.secret_key, secure=False)
    if client.bucket_exists(bucket):
        names = [DeleteObject(obj.object_name) for obj in client.list_objects(bucket, recursive=True)]
        assert list(client.remove_objects(bucket, names)) == []
        client.remove_bucket(bucket)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ArtifactStore]:
    """An open store of each backend in turn; the S3 one in a fresh bucket, dropped afterwards."""
    if request.param == "local":
        with open_store(LocalStoreConfig(path=tmp_path / "store")) as opened:
            yield opened
        return
    service = request.getfixturevalue("s3_service")
    bucket = request.getfixturevalue("unique_name")("conformance")
    config = S3StoreConfig(
        endpoint=service.endpoint,
        bucket=bucket,
        access_key=service.access_key,
        secret_key=service.secret_key,
        part_size=5 * MIB,
    )
    try:
        with open_store(config) as opened:
            yield opened
    finally:
        drop_bucket(service, bucket)


@pytest.fixture
def weights(tmp_path: Path) -> Callable[[str, bytes], Path]:
    """Write a local file to publish."""

    def write(name: str, data: bytes) -> Path:
        path = tmp_path / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    return write


def test_bytes_round_trip_exists_and_prefix_listing(store: ArtifactStore) -> None:
    infos = [store.put_bytes(key, key.encode()) for key in ("a/b", "a/bc/d", "a/c", "b", "empty/e")]
    store.put_bytes("empty/e", b"")
    assert infos[0] == ObjectInfo(key="a/b", size=3, sha256=sha256(b"a/b"))
    assert (store.get_bytes("a/bc/d"), store.get_bytes("empty/e")) == (b"a/bc/d", b"")
    assert [store.exists(key) for key in ("a/b", "a", "a/bc", "zzz")] == [True, False, False, False]
    assert store.list() == ["a/b", "a/bc/d", "a/c", "b", "empty/e"]
    assert store.list("a/") == ["a/b", "a/bc/d", "a/c"]
    assert store.list("a/b") == ["a/b", "a/bc/d"]
    assert store.list("nothing/") == []


def test_overwrite_replaces_the_whole_object(store: ArtifactStore) -> None:
    store.put_bytes("k", b"x" * 1000)
    store.put_bytes("k", b"short")
    assert store.get_bytes("k") == b"short"


def test_missing_keys(store: ArtifactStore, tmp_path: Path) -> None:
    with pytest.raises(ArtifactNotFoundError, match="'nope/x' not found"):
        store.get_bytes("nope/x")
    with pytest.raises(ArtifactNotFoundError):
        store.open_read("nope/x")
    with pytest.raises(ArtifactNotFoundError):
        store.get_file("nope/x", tmp_path / "dest")
    assert not (tmp_path / "dest").exists()
    store.delete("nope/x")  # deleting a missing key is not an error


def test_invalid_key_is_rejected_before_any_io(store: ArtifactStore) -> None:
    with pytest.raises(InvalidKeyError, match=r"invalid key 'a/\.\./b': '\.\.' parts are not allowed"):
        store.put_bytes("a/../b", b"x")
    with pytest.raises(InvalidKeyError, match="empty prefix"):
        store.delete_prefix("")


def test_delete_and_delete_prefix(store: ArtifactStore) -> None:
    for key in ("p/1", "p/2/x", "pq/3", "q"):
        store.put_bytes(key, b"data")
    store.delete("q")
    assert store.delete_prefix("p/") == 2
    assert store.list() == ["pq/3"]
    assert store.delete_prefix("p/") == 0


def test_large_file_streams_up_and_down_in_chunks(store: ArtifactStore, tmp_path: Path) -> None:
    data = os.urandom(12 * MIB + 12345)  # more than two 5 MiB parts on S3, twelve chunks locally
    source = tmp_path / "big.bin"
    source.write_bytes(data)
    assert store.put_file("big/file", source) == ObjectInfo("big/file", len(data), sha256(data))
    assert store.put_stream("big/stream", io.BytesIO(data)) == ObjectInfo("big/stream", len(data), sha256(data))
    downloaded = store.get_file("big/stream", tmp_path / "down" / "big.bin", sha256=sha256(data), size=len(data))
    assert downloaded == ObjectInfo("big/stream", len(data), sha256(data))
    assert (tmp_path / "down" / "big.bin").read_bytes() == data
    with store.open_read("big/file") as reader:
        assert (reader.read(10), b"".join(reader)) == (data[:10], data[10:])


def test_cut_off_upload_stores_nothing(store: ArtifactStore) -> None:
    with pytest.raises(SourceReadError, match="failed after 7340032 bytes: producer died"):
        store.put_stream("cut/obj", CutOffReader(7 * MIB))
    with pytest.raises(SourceReadError, match="ended after 3 of 10 bytes"):
        store.put_stream("cut/short", io.BytesIO(b"abc"), length=10)
    assert store.list() == []


def test_get_file_with_wrong_expectation_leaves_nothing(store: ArtifactStore, tmp_path: Path) -> None:
    store.put_bytes("k", b"content")
    with pytest.raises(IntegrityError, match="expected sha256"):
        store.get_file("k", tmp_path / "out", sha256="0" * 64)
    with pytest.raises(IntegrityError, match="expected 8 bytes, got 7"):
        store.get_file("k", tmp_path / "out", size=8)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "store") == []  # no 'out', no temporary file


def test_publish_list_latest_and_download(
    store: ArtifactStore, weights: Callable[[str, bytes], Path], tmp_path: Path
) -> None:
    model = os.urandom(3 * MIB)
    files = {"model.safetensors": weights("m", model), "tokenizer/config.json": io.BytesIO(b"{}")}
    first = store.publish_version("runs/r1/policy", 1, files, {"step": 100, "loss": 0.5})
    second = store.publish_version("runs/r1/policy", 2, {"model.safetensors": weights("m2", b"v2")}, {"step": 200})
    assert store.list_versions("runs/r1/policy") == [1, 2]
    assert store.latest_version("runs/r1/policy") == 2
    assert store.read_manifest("runs/r1/policy", 1) == first
    assert store.read_manifest("runs/r1/policy", 2) == second
    assert [(f.path, f.size, f.sha256) for f in first.files] == [
        ("model.safetensors", len(model), sha256(model)),
        ("tokenizer/config.json", 2, sha256(b"{}")),
    ]
    assert (first.name, first.version, first.metadata) == ("runs/r1/policy", 1, {"step": 100, "loss": 0.5})
    assert store.list("runs/r1/policy/v0000000001/") == [
        "runs/r1/policy/v0000000001/manifest.json",
        "runs/r1/policy/v0000000001/model.safetensors",
        "runs/r1/policy/v0000000001/tokenizer/config.json",
    ]

    dest = tmp_path / "engine"
    assert store.download_version("runs/r1/policy", 1, dest) == first
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == [
        "manifest.json",
        "model.safetensors",
        "tokenizer/config.json",
    ]
    assert ((dest / "model.safetensors").read_bytes(), (dest / "tokenizer/config.json").read_bytes()) == (model, b"{}")
    assert json.loads((dest / "manifest.json").read_bytes()) == json.loads(first.to_json())


def test_publishing_an_existing_version_fails_and_keeps_it(
    store: ArtifactStore, weights: Callable[[str, bytes], Path]
) -> None:
    original = store.publish_version("policy", 7, {"w": weights("w", b"one")}, {})
    with pytest.raises(VersionExistsError, match="policy v7 is already published"):
        store.publish_version("policy", 7, {"w": weights("w", b"two")}, {})
    assert store.read_manifest("policy", 7) == original
    assert store.get_bytes("policy/v0000000007/w") == b"one"


def test_a_version_exists_only_once_its_manifest_does(store: ArtifactStore) -> None:
    store.put_bytes("policy/v0000000003/model.bin", b"uploaded, manifest never written")
    assert (store.list_versions("policy"), store.latest_version("policy")) == ([], None)
    with pytest.raises(ArtifactNotFoundError, match="policy v3 does not exist"):
        store.read_manifest("policy", 3)


def test_upload_cut_off_midway_leaves_no_version(store: ArtifactStore, weights: Callable[[str, bytes], Path]) -> None:
    store.publish_version("policy", 1, {"w": weights("w1", b"one")}, {})
    files = {"a.bin": weights("a", os.urandom(MIB)), "b.bin": CutOffReader(6 * MIB)}
    with pytest.raises(SourceReadError, match="'policy/v0000000002/b.bin' failed after 6291456 bytes"):
        store.publish_version("policy", 2, files, {})
    assert store.list_versions("policy") == [1]
    assert store.latest_version("policy") == 1
    assert store.list("policy/v0000000002/") == []
    # The version number is free again: a retry publishes it.
    store.publish_version("policy", 2, {"a.bin": weights("a", b"retry")}, {})
    assert store.list_versions("policy") == [1, 2]


def test_download_detects_corruption_and_removes_partial_files(
    store: ArtifactStore, weights: Callable[[str, bytes], Path], tmp_path: Path
) -> None:
    store.publish_version("policy", 1, {"a.bin": weights("a", b"A" * 1000), "b.bin": weights("b", b"B" * 1000)}, {})
    store.put_bytes("policy/v0000000001/b.bin", b"B" * 999 + b"X")  # same size, different content
    dest = tmp_path / "engine"
    with pytest.raises(IntegrityError, match=r"'policy/v0000000001/b\.bin': expected sha256"):
        store.download_version("policy", 1, dest)
    assert [p for p in dest.rglob("*") if p.is_file()] == []
    manifest = store.download_version("policy", 1, dest, verify=False)
    assert [p.name for p in sorted(dest.iterdir())] == ["a.bin", "b.bin", "manifest.json"]
    assert manifest.file("b.bin").sha256 == sha256(b"B" * 1000)


def test_gc_keeps_the_newest_and_removes_abandoned_versions(
    store: ArtifactStore, weights: Callable[[str, bytes], Path]
) -> None:
    for version in (1, 2, 4, 5, 6):
        store.publish_version("policy", version, {"w": weights("w", str(version).encode())}, {})
    store.put_bytes("policy/v0000000003/w", b"abandoned")  # older than the newest complete version
    store.put_bytes("policy/v0000000009/w", b"in progress")  # newer: may be a publication under way
    store.publish_version("policy/value", 1, {"w": weights("v", b"value model")}, {})  # a nested artifact
    assert store.gc("policy", keep_last=2) == [1, 2, 3, 4]
    assert store.list_versions("policy") == [5, 6]
    assert store.list("policy/v0000000009/") == ["policy/v0000000009/w"]
    assert store.list_versions("policy/value") == [1]
    assert store.gc("policy", keep_last=2) == []
    with pytest.raises(ValueError, match="keep_last must be at least 1"):
        store.gc("policy", keep_last=0)


def test_a_version_read_into_memory_is_verified_file_by_file(
    store: ArtifactStore, weights: Callable[[str, bytes], Path]
) -> None:
    store.publish_version("policy", 1, {"a.bin": weights("a", b"A" * 1000), "d/b.bin": weights("b", b"B" * 10)}, {})
    manifest = store.read_manifest("policy", 1, sha256(store.get_bytes("policy/v0000000001/manifest.json")))
    assert store.read_version_files(manifest) == {"a.bin": b"A" * 1000, "d/b.bin": b"B" * 10}
    store.put_bytes("policy/v0000000001/a.bin", b"A" * 999 + b"X")  # same size, different content
    with pytest.raises(IntegrityError, match=r"'policy/v0000000001/a\.bin': expected sha256"):
        store.read_version_files(manifest)
    store.put_bytes("policy/v0000000001/a.bin", b"A" * 999)
    with pytest.raises(IntegrityError, match="expected 1000 bytes, got 999"):
        store.read_version_files(manifest)


def test_a_manifest_whose_bytes_are_not_the_expected_ones_is_refused(
    store: ArtifactStore, weights: Callable[[str, bytes], Path]
) -> None:
    store.publish_version("policy", 1, {"a.bin": weights("a", b"A")}, {})
    with pytest.raises(IntegrityError, match=r"manifest of policy v1 has sha256 [0-9a-f]{64}, expected 0{64}"):
        store.read_manifest("policy", 1, "0" * 64)


def test_a_scratch_download_is_complete_and_verified_without_fsyncs(
    store: ArtifactStore, weights: Callable[[str, bytes], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.publish_version("policy", 1, {"a.bin": weights("a", b"A" * 1000)}, {})
    manifest = store.read_manifest("policy", 1)
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    dest = tmp_path / "scratch"
    assert store.download_version("policy", 1, dest, manifest=manifest, durable=False) == manifest
    assert (dest / "a.bin").read_bytes() == b"A" * 1000 and (dest / "manifest.json").is_file()
    assert synced == []
    store.put_bytes("policy/v0000000001/a.bin", b"A" * 999 + b"X")
    with pytest.raises(IntegrityError, match="expected sha256"):
        store.download_version("policy", 1, tmp_path / "again", durable=False)
    with pytest.raises(ValueError, match="the manifest given is policy v1, not policy v2"):
        store.download_version("policy", 2, tmp_path / "other", manifest=manifest)


def test_copy_stores_the_same_bytes_under_a_second_key_and_a_missing_source_is_refused(store: ArtifactStore) -> None:
    store.put_bytes("a/config.json", b'{"n": 1}')

    store.copy("a/config.json", "b/config.json")
    store.sync("b/")

    assert store.get_bytes("b/config.json") == b'{"n": 1}'
    store.delete("a/config.json")
    assert store.get_bytes("b/config.json") == b'{"n": 1}'  # a copy, not a reference that dies with its source
    with pytest.raises(ArtifactNotFoundError):
        store.copy("a/config.json", "c/config.json")
    assert not store.exists("c/config.json")


def test_a_version_reuses_its_bases_unchanged_small_files_and_uploads_the_rest(
    store: ArtifactStore, weights: Callable[[str, bytes], Path], tmp_path: Path
) -> None:
    tokenizer, config = weights("tokenizer.json", b'{"vocab": 2}'), weights("config.json", b'{"layers": 2}')
    first = store.publish_version("policy", 1, {"w": weights("w1", b"weights 1"), "tokenizer.json": tokenizer,
                                                "config.json": config}, {})  # fmt: skip
    config_v2 = weights("config2.json", b'{"layers": 3}')  # same path, other content: uploaded
    second = store.publish_version(
        "policy", 2, {"w": weights("w2", b"weights 2"), "tokenizer.json": tokenizer, "config.json": config_v2}, {},
        base=first,
    )  # fmt: skip

    dest = tmp_path / "engine"
    assert store.download_version("policy", 2, dest, verify=True) == second
    assert {p.name: p.read_bytes() for p in dest.iterdir() if p.name != "manifest.json"} == {
        "w": b"weights 2", "tokenizer.json": b'{"vocab": 2}', "config.json": b'{"layers": 3}',
    }  # fmt: skip
    store.gc("policy", keep_last=1)  # the base gone, the reused file stays
    assert store.get_bytes("policy/v0000000002/tokenizer.json") == b'{"vocab": 2}'


def test_a_base_version_collected_before_publication_means_its_files_are_uploaded_again(
    store: ArtifactStore, weights: Callable[[str, bytes], Path]
) -> None:
    tokenizer = weights("tokenizer.json", b'{"vocab": 2}')
    first = store.publish_version("policy", 1, {"tokenizer.json": tokenizer}, {})
    store.delete_prefix("policy/v0000000001/")

    second = store.publish_version("policy", 2, {"tokenizer.json": tokenizer}, {}, base=first)

    assert store.read_version_files(second) == {"tokenizer.json": b'{"vocab": 2}'}
