"""S3-only behaviour against a real SeaweedFS S3 server with auth enforced: multipart, auth, reachability."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from minio import Minio
from minio.deleteobjects import DeleteObject

from orchard.config import S3StoreConfig
from orchard.store import (
    ObjectInfo,
    SourceReadError,
    StoreAuthError,
    StoreError,
    StoreUnavailableError,
    open_store,
)
from orchard.store.s3 import S3Store

pytestmark = pytest.mark.s3

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
        return b"\xcd" * n


def raw_client(service: Any) -> Minio:
    """A plain minio client, to look at the bucket behind the store's back."""
    return Minio(service.endpoint, service.access_key, service.secret_key, secure=False)


@pytest.fixture
def bucket(s3_service: Any, unique_name: Callable[[str], str]) -> Iterator[str]:
    """A bucket name unique to the test; the bucket (if created) and its objects are deleted afterwards."""
    name = unique_name("s3store")
    yield name
    client = raw_client(s3_service)
    if client.bucket_exists(name):
        names = [DeleteObject(obj.object_name) for obj in client.list_objects(name, recursive=True)]
        assert list(client.remove_objects(name, names)) == []
        client.remove_bucket(name)


@pytest.fixture
def make_config(s3_service: Any, bucket: str) -> Callable[..., S3StoreConfig]:
    """Build a config for the test bucket, with overrides."""

    def make(**overrides: Any) -> S3StoreConfig:
        fields = {
            "endpoint": s3_service.endpoint,
            "bucket": bucket,
            "access_key": s3_service.access_key,
            "secret_key": s3_service.secret_key,
            "part_size": 5 * MIB,
        }
        return S3StoreConfig(**(fields | overrides))

    return make


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_open_creates_the_bucket_once(make_config: Callable[..., S3StoreConfig], s3_service: Any, bucket: str) -> None:
    assert not raw_client(s3_service).bucket_exists(bucket)
    with open_store(make_config()) as store:
        assert isinstance(store, S3Store)
        assert store.location == f"s3://{s3_service.endpoint}/{bucket}"
        store.put_bytes("k", b"v")
    with open_store(make_config()) as again:  # an existing bucket is reused, not an error
        assert again.get_bytes("k") == b"v"
    assert raw_client(s3_service).bucket_exists(bucket)


@pytest.mark.parametrize("parallel_uploads", [1, 3])
def test_multipart_upload_and_streamed_download(
    make_config: Callable[..., S3StoreConfig], s3_service: Any, bucket: str, tmp_path: Path, parallel_uploads: int
) -> None:
    data = os.urandom(12 * MIB + 7)  # three 5 MiB parts
    digest = hashlib.sha256(data).hexdigest()
    source = tmp_path / "weights.bin"
    source.write_bytes(data)
    with open_store(make_config(parallel_uploads=parallel_uploads)) as store:
        assert store.put_file("w/known-length", source) == ObjectInfo("w/known-length", len(data), digest)
        with source.open("rb") as handle:  # unknown length: put_object(length=-1) streams part by part
            assert store.put_stream("w/unknown-length", handle) == ObjectInfo("w/unknown-length", len(data), digest)
        for key in ("w/known-length", "w/unknown-length"):
            # A multipart object's ETag is '<md5 of the part md5s>-<number of parts>'.
            stat = raw_client(s3_service).stat_object(bucket, key)
            assert (stat.size, (stat.etag or "").rsplit("-", 1)[-1]) == (len(data), "3")
            dest = tmp_path / "down" / key
            assert store.get_file(key, dest, sha256=digest, size=len(data)) == ObjectInfo(key, len(data), digest)
            assert dest.read_bytes() == data
        with store.open_read("w/known-length") as reader:
            chunks = list(reader)
        assert (max(len(c) for c in chunks) <= MIB, b"".join(chunks)) == (True, data)


@pytest.mark.parametrize(
    ("access_key", "secret_key", "code"),
    [("orchard-access", "wrong-secret", "SignatureDoesNotMatch"), ("nobody", "wrong-secret", "InvalidAccessKeyId")],
)
def test_wrong_credentials_raise_store_auth_error(
    make_config: Callable[..., S3StoreConfig], s3_service: Any, access_key: str, secret_key: str, code: str
) -> None:
    if access_key == "orchard-access":
        access_key = s3_service.access_key  # the real key id, with a wrong secret
    with pytest.raises(StoreAuthError, match=f"{code} while checking bucket .* check access_key/secret_key"):
        open_store(make_config(access_key=access_key, secret_key=secret_key))


def test_anonymous_access_is_denied(make_config: Callable[..., S3StoreConfig]) -> None:
    with pytest.raises(StoreAuthError, match="AccessDenied"):
        open_store(make_config(access_key="", secret_key=""))


def test_unreachable_endpoint_fails_fast(make_config: Callable[..., S3StoreConfig]) -> None:
    endpoint = f"127.0.0.1:{closed_port()}"
    start = time.monotonic()
    with pytest.raises(StoreUnavailableError, match=f"S3 endpoint {endpoint} unreachable .*timeout 2 s per attempt"):
        open_store(make_config(endpoint=endpoint, timeout_s=2.0, retries=2))
    assert time.monotonic() - start < 15


def test_silent_endpoint_times_out(make_config: Callable[..., S3StoreConfig]) -> None:
    with socket.socket() as server:  # accepts connections (kernel backlog) but never answers
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        endpoint = f"127.0.0.1:{server.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(StoreUnavailableError, match="Read timed out"):
            open_store(make_config(endpoint=endpoint, timeout_s=1.0, retries=1))
        assert time.monotonic() - start < 15


def test_endpoint_with_scheme_is_rejected(make_config: Callable[..., S3StoreConfig]) -> None:
    with pytest.raises(StoreError, match="expected host:port"):
        open_store(make_config(endpoint="http://127.0.0.1:9000/path"))


def test_upload_cut_off_after_a_part_leaves_no_manifest(
    make_config: Callable[..., S3StoreConfig], s3_service: Any, bucket: str, tmp_path: Path
) -> None:
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"complete file")
    with open_store(make_config()) as store:
        # 7 MiB then failure: one 5 MiB part has gone up in a multipart upload when the source dies.
        files = {"a.bin": weights, "b.bin": CutOffReader(7 * MIB)}
        with pytest.raises(SourceReadError, match="producer died"):
            store.publish_version("policy", 1, files, {})
        assert store.list_versions("policy") == []
        assert [obj.object_name for obj in raw_client(s3_service).list_objects(bucket, recursive=True)] == []
