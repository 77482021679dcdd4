"""The manifest document: JSON round trip, forward compatibility, and rejection of unsafe or broken content."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from orchard.store import ArtifactNotFoundError, IntegrityError, Manifest, ManifestFile

SHA_A = "a" * 64
SHA_B = "b" * 64


def manifest_dict(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "manifest_version": 1,
        "name": "runs/r1/policy",
        "version": 12,
        "created_at": "2026-11-29T12:00:00Z",
        "files": [{"path": "a.bin", "size": 3, "sha256": SHA_A}, {"path": "dir/b.bin", "size": 0, "sha256": SHA_B}],
        "metadata": {"step": 1200, "tags": ["x"], "lr": 1e-5, "note": None},
    }
    return doc | overrides


def test_json_round_trip() -> None:
    manifest = Manifest(
        name="runs/r1/policy",
        version=12,
        created_at=datetime(2026, 11, 29, 12, tzinfo=UTC),
        files=(ManifestFile(path="a.bin", size=3, sha256=SHA_A), ManifestFile(path="dir/b.bin", size=0, sha256=SHA_B)),
        metadata={"step": 1200, "tags": ["x"], "lr": 1e-5, "note": None},
    )
    assert Manifest.from_json(manifest.to_json()) == manifest
    assert json.loads(manifest.to_json()) == manifest_dict(created_at="2026-11-29T12:00:00Z")
    assert (manifest.total_size, manifest.file("dir/b.bin")) == (3, manifest.files[1])
    with pytest.raises(ArtifactNotFoundError, match="runs/r1/policy v12 has no file 'c.bin'"):
        manifest.file("c.bin")


def test_unknown_fields_from_a_newer_writer_are_ignored() -> None:
    doc = manifest_dict(compression="zstd")
    doc["files"][0]["chunks"] = 4
    assert Manifest.from_json(json.dumps(doc)) == Manifest.from_json(json.dumps(manifest_dict()))


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"files": [{"path": "../../etc/passwd", "size": 1, "sha256": SHA_A}]}, "invalid file path"),
        ({"files": [{"path": "/abs", "size": 1, "sha256": SHA_A}]}, "must not start with '/'"),
        ({"files": [{"path": "a", "size": 1, "sha256": "XYZ"}]}, "should match pattern"),
        ({"files": [{"path": "a", "size": -1, "sha256": SHA_A}]}, "greater than or equal to 0"),
        ({"files": [{"path": "a", "size": 1, "sha256": SHA_A}] * 2}, "duplicate file paths: \\['a'\\]"),
        ({"files": [{"path": "manifest.json", "size": 1, "sha256": SHA_A}]}, "reserved for the manifest"),
        ({"created_at": "2026-11-29T12:00:00"}, "timezone"),
        ({"version": -3}, "greater than or equal to 0"),
    ],
)
def test_broken_manifests_are_integrity_errors(overrides: dict[str, Any], problem: str) -> None:
    with pytest.raises(IntegrityError, match=f"unreadable manifest s3://b/k: .*{problem}"):
        Manifest.from_json(json.dumps(manifest_dict(**overrides)), source="s3://b/k")


def test_not_json_is_an_integrity_error() -> None:
    with pytest.raises(
        IntegrityError,
        match=r"unreadable manifest manifest: \(document\): Invalid JSON: expected value at line 1 column 1$",
    ):
        Manifest.from_json(b"\x00garbage")
