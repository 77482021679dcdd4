"""The local-directory store: primitives, key rules, on-disk atomicity and the versioned-artifact logic."""

from __future__ import annotations

import hashlib
import io
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from orchard.config import LocalStoreConfig
from orchard.store import (
    ArtifactNotFoundError,
    IntegrityError,
    InvalidKeyError,
    ObjectInfo,
    SourceReadError,
    StoreError,
    VersionExistsError,
    open_store,
    versions,
)
from orchard.store.base import CHUNK_SIZE, TEMP_PREFIX, validate_key, validate_prefix
from orchard.store.local import LocalStore

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
        return b"\x01" * n


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def files_under(root: Path) -> list[str]:
    """Every file below ``root``, temporary ones included, as sorted relative paths."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    opened = open_store(LocalStoreConfig(path=tmp_path / "store"))
    assert isinstance(opened, LocalStore)
    return opened


@pytest.fixture
def source(tmp_path: Path) -> Callable[[str, bytes], Path]:
    """Write a local file to publish."""

    def write(name: str, data: bytes) -> Path:
        path = tmp_path / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    return write


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("", "must be a non-empty string"),
        ("/abs", "must not start with '/'"),
        ("a//b", "empty part"),
        ("a/", "empty part"),
        ("a/../b", "'..' parts are not allowed"),
        ("..", "'..' parts are not allowed"),
        ("./a", "'.' parts are not allowed"),
        ("a\\b", "backslashes and control characters"),
        ("a\nb", "backslashes and control characters"),
        ("a/.orchard-tmp-x", "reserved for temporary files"),
        ("x" * 1025, "longer than 1024 bytes"),
    ],
)
def test_invalid_keys_are_rejected_with_the_reason(store: LocalStore, key: str, problem: str) -> None:
    with pytest.raises(InvalidKeyError, match=f"invalid key .*{problem}") as caught:
        store.put_bytes(key, b"x")
    assert isinstance(caught.value, ValueError)
    with pytest.raises(InvalidKeyError):
        store.exists(key)
    assert files_under(store.root) == []


def test_valid_keys_and_prefixes() -> None:
    assert [validate_key(k) for k in ("a", "a/b.c", "dir with space/ü.bin", "x" * 1024)] == [
        "a",
        "a/b.c",
        "dir with space/ü.bin",
        "x" * 1024,
    ]
    assert [validate_prefix(p) for p in ("", "a/", "a/b")] == ["", "a/", "a/b"]
    with pytest.raises(InvalidKeyError, match="invalid prefix '/a'"):
        validate_prefix("/a")


def test_round_trip_lays_keys_out_as_files(store: LocalStore) -> None:
    assert store.put_bytes("a/b/c.bin", b"hello") == ObjectInfo("a/b/c.bin", 5, sha256(b"hello"))
    assert store.get_bytes("a/b/c.bin") == b"hello"
    path = store.root / "a" / "b" / "c.bin"
    assert (path.read_bytes(), stat.S_IMODE(path.stat().st_mode)) == (b"hello", 0o644)
    assert store.location == store.root.as_uri()


def test_a_crashed_write_is_invisible(store: LocalStore) -> None:
    store.put_bytes("a/x", b"x")
    (store.root / "a" / f"{TEMP_PREFIX}crashed").write_bytes(b"half")
    assert store.list() == ["a/x"]


def test_a_key_cannot_also_be_a_directory(store: LocalStore) -> None:
    store.put_bytes("a", b"file")
    with pytest.raises(StoreError, match="cannot store 'a/b'"):
        store.put_bytes("a/b", b"nested")
    assert store.get_bytes("a") == b"file"


def test_delete_prunes_emptied_directories(store: LocalStore) -> None:
    store.put_bytes("a/b/c", b"1")
    store.put_bytes("a/d", b"2")
    store.delete("a/b/c")
    assert sorted(p.relative_to(store.root).as_posix() for p in store.root.rglob("*")) == ["a", "a/d"]
    assert store.delete_prefix("a/") == 1
    assert list(store.root.iterdir()) == []


def test_large_file_streams_in_chunks_with_one_pass_sha256(store: LocalStore, tmp_path: Path) -> None:
    data = os.urandom(20 * MIB + 3)
    big = tmp_path / "big.bin"
    big.write_bytes(data)
    assert store.put_file("big", big) == ObjectInfo("big", len(data), sha256(data))
    with store.open_read("big") as reader:
        sizes = [len(chunk) for chunk in reader]
    assert (sizes[0], max(sizes), sum(sizes)) == (CHUNK_SIZE, CHUNK_SIZE, len(data))
    out = tmp_path / "out" / "big.bin"
    assert store.get_file("big", out, sha256=sha256(data), size=len(data)) == ObjectInfo("big", len(data), sha256(data))
    assert out.read_bytes() == data


def test_cut_off_upload_leaves_no_object_and_no_temporary_file(store: LocalStore) -> None:
    store.put_bytes("k", b"previous")
    with pytest.raises(SourceReadError, match="reading the source of 'k' failed after 3145728 bytes") as caught:
        store.put_stream("k", CutOffReader(3 * MIB))
    assert isinstance(caught.value.__cause__, ConnectionResetError)
    assert (store.get_bytes("k"), files_under(store.root)) == (b"previous", ["k"])


def test_put_stream_with_length_stores_exactly_that_many_bytes(store: LocalStore) -> None:
    assert store.put_stream("k", io.BytesIO(b"0123456789"), length=4) == ObjectInfo("k", 4, sha256(b"0123"))
    assert store.get_bytes("k") == b"0123"


def test_put_file_of_a_missing_file(store: LocalStore, tmp_path: Path) -> None:
    with pytest.raises(SourceReadError, match="cannot read .*missing"):
        store.put_file("k", tmp_path / "missing")


def test_open_on_a_file_root_fails(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StoreError, match="cannot create store directory"):
        open_store(LocalStoreConfig(path=tmp_path / "file"))


def test_publish_list_latest_download_verify(
    store: LocalStore, source: Callable[[str, bytes], Path], tmp_path: Path
) -> None:
    assert (store.list_versions("policy"), store.latest_version("policy")) == ([], None)
    model = os.urandom(2 * MIB)
    manifest = store.publish_version(
        "policy", 3, {"model.bin": source("m", model), "cfg/a.json": source("c", b"{}")}, {"s": 1}
    )
    assert files_under(store.root) == [
        "policy/v0000000003/cfg/a.json",
        "policy/v0000000003/manifest.json",
        "policy/v0000000003/model.bin",
    ]
    assert [(f.path, f.size, f.sha256) for f in manifest.files] == [
        ("cfg/a.json", 2, sha256(b"{}")),
        ("model.bin", len(model), sha256(model)),
    ]
    assert (store.list_versions("policy"), store.latest_version("policy")) == ([3], 3)
    dest = tmp_path / "engine"
    assert store.download_version("policy", 3, dest) == manifest
    assert ((dest / "model.bin").read_bytes(), files_under(dest)) == (
        model,
        ["cfg/a.json", "manifest.json", "model.bin"],
    )


def test_corrupted_file_on_disk_raises_integrity_error(
    store: LocalStore, source: Callable[[str, bytes], Path], tmp_path: Path
) -> None:
    store.publish_version("policy", 1, {"a.bin": source("a", b"a" * 100), "b.bin": source("b", b"b" * 100)}, {})
    (store.root / "policy" / "v0000000001" / "b.bin").write_bytes(b"b" * 99 + b"!")  # bit rot, same size
    dest = tmp_path / "engine"
    (dest).mkdir()
    (dest / "manifest.json").write_bytes(b"stale manifest of an older download")
    with pytest.raises(IntegrityError, match=r"'policy/v0000000001/b\.bin': expected sha256 [0-9a-f]{64}, got"):
        store.download_version("policy", 1, dest)
    assert files_under(dest) == []  # a.bin (already downloaded) removed, b.bin never renamed in, no stale manifest
    (store.root / "policy" / "v0000000001" / "b.bin").write_bytes(b"b" * 50)  # truncated
    with pytest.raises(IntegrityError, match="expected 100 bytes, got 50"):
        store.download_version("policy", 1, dest)


def test_unreadable_or_mismatched_manifest_is_an_integrity_error(store: LocalStore) -> None:
    store.put_bytes("policy/v0000000001/manifest.json", b"{not json")
    assert store.list_versions("policy") == [1]
    with pytest.raises(IntegrityError, match="unreadable manifest .*policy/v0000000001/manifest.json"):
        store.read_manifest("policy", 1)
    store.publish_version("other", 2, {}, {})
    store.put_bytes("policy/v0000000002/manifest.json", store.get_bytes("other/v0000000002/manifest.json"))
    with pytest.raises(IntegrityError, match="describes other v2"):
        store.read_manifest("policy", 2)


def test_gc_keeps_last_n(store: LocalStore, source: Callable[[str, bytes], Path]) -> None:
    for version in range(1, 6):
        store.publish_version("policy", version, {"w": source("w", bytes([version]))}, {})
    assert store.gc("policy", keep_last=3) == [1, 2]
    assert store.list_versions("policy") == [3, 4, 5]
    assert sorted({key.split("/")[1] for key in store.list("policy/")}) == ["v0000000003", "v0000000004", "v0000000005"]
    assert store.gc("policy", keep_last=10) == []


def test_upload_cut_off_halfway_leaves_no_manifest(store: LocalStore, source: Callable[[str, bytes], Path]) -> None:
    files = {"a.bin": source("a", b"first file"), "b.bin": CutOffReader(2 * MIB + 5)}
    with pytest.raises(SourceReadError, match="producer died"):
        store.publish_version("policy", 1, files, {"step": 1})
    assert (store.list_versions("policy"), store.latest_version("policy"), files_under(store.root)) == ([], None, [])


def test_leftovers_of_an_unfinished_publication_are_replaced(
    store: LocalStore, source: Callable[[str, bytes], Path]
) -> None:
    store.put_bytes("policy/v0000000001/stale.bin", b"from a crashed publisher")
    store.publish_version("policy", 1, {"w": source("w", b"w")}, {})
    assert store.list("policy/") == ["policy/v0000000001/manifest.json", "policy/v0000000001/w"]
    with pytest.raises(VersionExistsError):
        store.publish_version("policy", 1, {"w": source("w", b"w")}, {})


@pytest.mark.parametrize(
    ("name", "version", "files", "metadata", "error", "match"),
    [
        ("policy", 1, {"manifest.json": io.BytesIO(b"")}, {}, InvalidKeyError, "reserved for the manifest"),
        ("policy", 1, {"../x": io.BytesIO(b"")}, {}, InvalidKeyError, "invalid file path"),
        ("runs/v0000000001", 1, {}, {}, InvalidKeyError, "invalid artifact name"),
        ("policy", -1, {}, {}, ValueError, "version must be an int"),
        ("policy", 10**10, {}, {}, ValueError, "version must be an int"),
        ("policy", 1, {}, {"x": object()}, ValueError, "must be JSON-serialisable"),
        ("policy", 1, {"w": Path("/nonexistent/w")}, {}, SourceReadError, "not a readable file"),
    ],
)
def test_bad_publications_are_refused_before_any_upload(
    store: LocalStore,
    name: str,
    version: int,
    files: dict[str, object],
    metadata: dict[str, object],
    error: type[Exception],
    match: str,
) -> None:
    with pytest.raises(error, match=match):
        store.publish_version(name, version, files, metadata)  # type: ignore[arg-type]
    assert files_under(store.root) == []


def test_missing_version(store: LocalStore, tmp_path: Path) -> None:
    with pytest.raises(ArtifactNotFoundError, match="policy v1 does not exist in file://"):
        store.download_version("policy", 1, tmp_path / "engine")
    assert not (tmp_path / "engine").exists()


def test_a_reused_file_is_a_hard_link_to_the_base_versions_and_large_files_are_never_compared(
    store: LocalStore, source: Callable[[str, bytes], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    big = b"\x01" * (versions.REUSE_MAX_BYTES + 1)
    files = {"tokenizer.json": source("t", b"{}"), "w": source("w", big)}
    first = store.publish_version("policy", 1, files, {})
    hashed: list[Path] = []
    monkeypatch.setattr(versions, "_sha256", lambda path: hashed.append(path) or sha256(path.read_bytes()))

    store.publish_version("policy", 2, files, {}, base=first)

    v1, v2 = store.root / "policy" / "v0000000001", store.root / "policy" / "v0000000002"
    assert (v2 / "tokenizer.json").stat().st_ino == (v1 / "tokenizer.json").stat().st_ino
    assert (v2 / "w").stat().st_ino != (v1 / "w").stat().st_ino  # uploaded: over REUSE_MAX_BYTES
    assert hashed == [files["tokenizer.json"]]


def test_where_hard_links_fail_a_copy_writes_the_bytes(store: LocalStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.put_bytes("a/x", b"payload")

    def refuse(*args: object) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", refuse)
    store.copy("a/x", "b/x")

    assert store.get_bytes("b/x") == b"payload"
    assert (store.root / "b" / "x").stat().st_nlink == 1
    assert [p.name for p in (store.root / "b").iterdir()] == ["x"]  # no temporary left behind


@pytest.mark.parametrize("setting", ["always", "never"])
def test_fsync_never_publishes_the_same_version_without_a_single_fsync(
    setting: str, tmp_path: Path, source: Callable[[str, bytes], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    with open_store(LocalStoreConfig(path=tmp_path / "s", fsync=setting)) as store:  # type: ignore[arg-type]
        files = {"tokenizer.json": source("t", b"{}"), "w": source("w", b"weights")}
        first = store.publish_version("policy", 1, files, {})
        store.publish_version("policy", 2, files, {}, base=first)

        assert store.read_manifest("policy", 2).files == first.files
        assert store.get_bytes("policy/v0000000002/w") == b"weights"
    assert (len(synced) > 0) == (setting == "always")


def test_an_unknown_fsync_setting_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fsync"):
        LocalStoreConfig(path=tmp_path, fsync="sometimes")  # type: ignore[arg-type]
