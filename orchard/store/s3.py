"""The production store: a bucket on any S3-compatible server (MinIO, SeaweedFS, AWS) through the minio client.

Departures from the minio defaults, and why:

- The client gets its own urllib3 pool: connect and read timeouts of ``timeout_s``, ``retries`` retries with
  backoff capped at 2 s. An unreachable endpoint therefore fails in about ``(retries + 1) * timeout_s`` instead
  of minio's five retries of five-minute timeouts, and the error names the endpoint and the timeout.
- Uploads always go through ``put_object`` with ``part_size`` from the config (``length=-1`` when the size is
  unknown), so large files stream as multipart uploads holding about ``parallel_uploads + 3`` parts in memory;
  minio aborts the multipart upload when the source fails, so a cut-off upload leaves no object behind. (When
  the source fails, minio 7.2 leaves its ``parallel_uploads`` idle worker threads behind; ``parallel_uploads=1``
  uploads parts sequentially without threads.)
- Every minio, urllib3 and socket error is translated into a ``StoreError`` subclass, with the cause chained.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import certifi
import urllib3
from minio import Minio
from minio.commonconfig import CopySource
from minio.deleteobjects import DeleteObject
from minio.error import InvalidResponseError, S3Error, ServerError
from urllib3.exceptions import MaxRetryError

from orchard.config import S3StoreConfig
from orchard.logging import get_logger
from orchard.store.base import CHUNK_SIZE, ArtifactStore, HashingReader, ObjectReader
from orchard.store.exceptions import ArtifactNotFoundError, StoreAuthError, StoreError, StoreUnavailableError

# Codes S3 servers answer with when the key pair is unknown, the signature (secret) is wrong or access is denied.
_AUTH_CODES = frozenset(
    {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "AllAccessDisabled"}
)
_BUCKET_RACE_CODES = frozenset({"BucketAlreadyOwnedByYou", "BucketAlreadyExists"})
_BACKOFF_MAX_S = 2.0
_POOL_SIZE = 10  # minio's own default; covers its parallel part uploads plus a few concurrent reads

_log = get_logger("store.s3")


def _http_pool(config: S3StoreConfig) -> urllib3.PoolManager:
    """The HTTP pool of the minio client, with bounded timeouts and retries."""
    options: dict[str, object] = {
        "timeout": urllib3.Timeout(connect=config.timeout_s, read=config.timeout_s),
        "retries": urllib3.Retry(
            total=config.retries,
            backoff_factor=0.2,
            backoff_max=_BACKOFF_MAX_S,
            status_forcelist=(500, 502, 503, 504),
        ),
        "maxsize": _POOL_SIZE,
    }
    if config.secure:
        options.update(cert_reqs="CERT_REQUIRED", ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where())
    return urllib3.PoolManager(**options)  # type: ignore[arg-type]


def _release(response: urllib3.BaseHTTPResponse) -> None:
    response.close()
    response.release_conn()


class S3Store(ArtifactStore):
    """An ``ArtifactStore`` in one bucket of an S3-compatible server; ``check()`` creates the bucket if missing."""

    def __init__(self, config: S3StoreConfig) -> None:
        self._config = config
        self._bucket = config.bucket
        self._http = _http_pool(config)
        try:
            self._client = Minio(
                config.endpoint,
                access_key=config.access_key.get_secret_value() or None,
                secret_key=config.secret_key.get_secret_value() or None,
                secure=config.secure,
                region=config.region,
                http_client=self._http,
            )
        except ValueError as exc:  # minio rejects a scheme or path in the endpoint
            raise StoreError(f"invalid S3 endpoint {config.endpoint!r} (expected host:port): {exc}") from exc

    @property
    def location(self) -> str:
        """``s3://endpoint/bucket``."""
        return f"s3://{self._config.endpoint}/{self._bucket}"

    def check(self) -> None:
        """Reach the server and create the bucket if it is missing.

        Wrong credentials raise ``StoreAuthError``; an unreachable or failing server ``StoreUnavailableError``.
        """
        with self._errors(f"checking bucket {self._bucket!r}"):
            if self._client.bucket_exists(self._bucket):
                return
            try:
                self._client.make_bucket(self._bucket, location=self._config.region)
            except S3Error as exc:
                if exc.code not in _BUCKET_RACE_CODES:  # another process created it between the two calls
                    raise
        _log.info("bucket created", location=self.location)

    def close(self) -> None:
        """Close the pooled HTTP connections."""
        self._http.clear()

    def _write(self, key: str, source: HashingReader, length: int | None) -> None:
        with self._errors(f"uploading {key!r}", key):
            self._client.put_object(
                self._bucket,
                key,
                source,
                length=-1 if length is None else length,
                part_size=self._config.part_size,
                num_parallel_uploads=self._config.parallel_uploads,
            )

    def _copy(self, src: str, dst: str) -> None:
        # server-side: the bytes never leave the server (a single CopyObject, for objects up to 5 GiB)
        with self._errors(f"copying {src!r} to {dst!r}", src):
            self._client.copy_object(self._bucket, dst, CopySource(self._bucket, src))

    def _open(self, key: str) -> ObjectReader:
        with self._errors(f"reading {key!r}", key):
            response = self._client.get_object(self._bucket, key)
        return ObjectReader(key, self._chunks(response, key), partial(_release, response))

    def _chunks(self, response: urllib3.BaseHTTPResponse, key: str) -> Iterator[bytes]:
        # Errors mid-body (connection reset, read timeout, truncated body) surface here, while iterating.
        with self._errors(f"reading {key!r}", key):
            yield from response.stream(CHUNK_SIZE)

    def _exists(self, key: str) -> bool:
        try:
            with self._errors(f"checking {key!r}", key):
                self._client.stat_object(self._bucket, key)
        except ArtifactNotFoundError:
            return False
        return True

    def _list(self, prefix: str) -> list[str]:
        with self._errors(f"listing {prefix!r}"):
            objects = self._client.list_objects(self._bucket, prefix=prefix or None, recursive=True)
            return [obj.object_name for obj in objects if obj.object_name and not obj.is_dir]

    def _delete(self, key: str) -> None:
        try:
            with self._errors(f"deleting {key!r}", key):
                self._client.remove_object(self._bucket, key)
        except ArtifactNotFoundError:
            return

    def _delete_many(self, keys: list[str]) -> None:
        with self._errors(f"deleting {len(keys)} keys"):
            # remove_objects is lazy: the deletes happen only as its result is consumed.
            failures = list(self._client.remove_objects(self._bucket, [DeleteObject(key) for key in keys]))
        if failures:
            first = failures[0]
            error_class = StoreAuthError if first.code in _AUTH_CODES else StoreError
            raise error_class(
                f"{self.location}: {len(failures)} of {len(keys)} deletes failed, e.g. {first.name!r}: "
                f"{first.code}: {first.message}"
            )

    @contextmanager
    def _errors(self, action: str, key: str | None = None) -> Iterator[None]:
        """Translate minio, urllib3 and socket errors raised inside the block into ``StoreError`` subclasses."""
        try:
            yield
        except S3Error as exc:
            raise self._s3_error(exc, action, key) from exc
        except ServerError as exc:
            raise StoreUnavailableError(f"{self.location}: server error while {action}: {exc}") from exc
        except InvalidResponseError as exc:
            raise StoreError(
                f"{self.location}: answer is not S3 while {action} (is {self._config.endpoint} an S3 API?): {exc}"
            ) from exc
        except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as exc:
            reason = exc.reason if isinstance(exc, MaxRetryError) else exc
            raise StoreUnavailableError(
                f"S3 endpoint {self._config.endpoint} unreachable while {action} "
                f"(timeout {self._config.timeout_s:g} s per attempt, {self._config.retries} retries): {reason}"
            ) from exc
        except OSError as exc:  # e.g. minio's "stream having not enough data"
            raise StoreError(f"{self.location}: {action} failed: {exc}") from exc

    def _s3_error(self, exc: S3Error, action: str, key: str | None) -> StoreError:
        code = exc.code or "unknown"
        if code in _AUTH_CODES:
            return StoreAuthError(
                f"{self.location}: {code} while {action}: the server rejected the credentials or denied access; "
                f"check access_key/secret_key (ORCHARD_STORE__ACCESS_KEY, ORCHARD_STORE__SECRET_KEY) "
                f"and their permissions on bucket {self._bucket!r}"
            )
        if code == "NoSuchKey":
            return ArtifactNotFoundError(f"{key!r} not found in {self.location}")
        if code == "NoSuchBucket":
            return StoreError(f"bucket {self._bucket!r} does not exist at {self._config.endpoint} (check() creates it)")
        return StoreError(f"{self.location}: {action} failed: {code}: {exc.message}")
