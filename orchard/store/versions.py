"""Versioned artifacts on any ``ArtifactStore``: publish, list, read, download and garbage-collect versions.

Layout: ``<name>/v<version, 10 digits>/<file>`` and ``<name>/v<...>/manifest.json``. Zero-padding makes the
lexical order of keys the numeric order of versions.

The manifest is written last and deleted first, so a version exists exactly while its manifest does: readers
never see a half-uploaded or half-deleted version, on any backend, without multi-object transactions (which S3
lacks). Files of a version without a manifest are leftovers of a failed publication (or one in progress).
One publisher per name is assumed: plain S3 has no portable create-if-absent, so two processes publishing the
same version at once could both pass the existence check.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from contextlib import suppress
from datetime import UTC, datetime
from os import PathLike
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue, TypeAdapter, ValidationError

from orchard.logging import get_logger
from orchard.store.base import ObjectInfo, Reader, atomic_write, validate_key
from orchard.store.exceptions import (
    ArtifactNotFoundError,
    IntegrityError,
    InvalidKeyError,
    SourceReadError,
    StoreError,
    VersionExistsError,
)
from orchard.store.manifest import MANIFEST_NAME, Manifest, ManifestFile

if TYPE_CHECKING:
    from orchard.store.base import ArtifactStore

VERSION_DIGITS = 10
MAX_VERSION = 10**VERSION_DIGITS - 1
REUSE_MAX_BYTES = 16 * 2**20
"""Largest file ``publish_version`` compares with its base version's (hashing it once more): configs and tokenizers
are small and the same every version; weights are large and change every version, so they are not compared."""
_VERSION_DIR = re.compile(rf"v(\d{{{VERSION_DIGITS}}})")
_METADATA = TypeAdapter(dict[str, JsonValue])

_log = get_logger("store.versions")


def validate_name(name: str) -> str:
    """Return ``name`` if it can name an artifact: a valid key none of whose parts looks like a version directory.

    The second rule keeps one name's versions from being mistaken for (and garbage-collected as) another's.
    """
    validate_key(name, what="artifact name")
    if any(_VERSION_DIR.fullmatch(part) for part in name.split("/")):
        raise InvalidKeyError(f"invalid artifact name {name!r}: parts like 'v{'0' * VERSION_DIGITS}' are reserved")
    return name


def version_prefix(name: str, version: int) -> str:
    """The key prefix of one version's files: ``<name>/v<version, zero-padded to 10 digits>/``."""
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= MAX_VERSION:
        raise ValueError(f"version must be an int in [0, {MAX_VERSION}], got {version!r}")
    return f"{validate_name(name)}/v{version:0{VERSION_DIGITS}d}/"


def manifest_key(name: str, version: int) -> str:
    """The key of a version's manifest."""
    return version_prefix(name, version) + MANIFEST_NAME


def publish_version(
    store: ArtifactStore,
    name: str,
    version: int,
    files: Mapping[str, Path | Reader],
    metadata: Mapping[str, Any] | None = None,
    *,
    base: Manifest | None = None,
) -> Manifest:
    """Upload ``files`` (path inside the version -> local file or reader) as ``version`` of ``name``.

    Each file is streamed up while its size and sha256 are computed, then the manifest is written last. With
    ``base`` (an earlier version's manifest, e.g. the one before), a local file of up to ``REUSE_MAX_BYTES`` whose
    path, size and sha256 equal one of ``base``'s is copied inside the store (``ArtifactStore.copy``: a hard link on
    disk) instead of uploaded: a trainer's configs and tokenizer files, the same in every version. Publishing
    a version that already has a manifest raises ``VersionExistsError``; leftovers of an earlier failed attempt
    are removed first. If anything fails, no manifest exists, this version's uploaded files are deleted (best
    effort) and the ``StoreError`` propagates.
    """
    prefix = version_prefix(name, version)
    sources = _check_files(files)
    meta = _check_metadata(name, version, metadata)
    key = prefix + MANIFEST_NAME
    if store.exists(key):
        raise VersionExistsError(f"{name} v{version} is already published in {store.location}")
    leftovers = store.delete_prefix(prefix)
    if leftovers:
        _log.warning("removed leftovers of an unfinished publication", name=name, version=version, keys=leftovers)
    start = perf_counter()
    try:
        reused = {path: _reuse(store, prefix, path, source, base) for path, source in sources}
        entries = tuple(reused[path] or _upload(store, prefix, path, source) for path, source in sources)
        if any(reused.values()):
            store.sync(prefix)  # the copies are durable before the manifest names them
        manifest = Manifest(name=name, version=version, created_at=datetime.now(UTC), files=entries, metadata=meta)
        store.put_bytes(key, manifest.to_json())
    except Exception:
        _discard(store, name, version)
        raise
    _log.info(
        "version published",
        location=store.location,
        name=name,
        version=version,
        files=len(entries),
        size=manifest.total_size,
        seconds=round(perf_counter() - start, 3),
    )
    return manifest


def _check_files(files: Mapping[str, Path | Reader]) -> list[tuple[str, Path | Reader]]:
    # Everything that can be checked locally is, before the first byte goes up.
    checked: list[tuple[str, Path | Reader]] = []
    for path, source in sorted(files.items()):
        validate_key(path, what="file path")
        if path == MANIFEST_NAME:
            raise InvalidKeyError(f"file path {MANIFEST_NAME!r} is reserved for the manifest")
        if isinstance(source, str | PathLike):
            source = Path(source)
            if not source.is_file():
                raise SourceReadError(f"cannot publish {path!r}: {source} is not a readable file")
        checked.append((path, source))
    return checked


def _check_metadata(name: str, version: int, metadata: Mapping[str, Any] | None) -> dict[str, JsonValue]:
    try:
        return _METADATA.validate_python(dict(metadata or {}))
    except ValidationError as exc:
        raise ValueError(f"metadata of {name} v{version} must be JSON-serialisable: {exc}") from exc


def _reuse(
    store: ArtifactStore, prefix: str, path: str, source: Path | Reader, base: Manifest | None
) -> ManifestFile | None:
    """``path``'s entry when ``base`` holds the same content and it was copied from there; else None (upload it)."""
    if base is None or not isinstance(source, Path):
        return None
    stored = next((entry for entry in base.files if entry.path == path), None)
    try:
        size = source.stat().st_size
        if stored is None or stored.size != size or size > REUSE_MAX_BYTES or _sha256(source) != stored.sha256:
            return None
        store.copy(version_prefix(base.name, base.version) + path, prefix + path)
    except (OSError, StoreError) as exc:  # e.g. the base version was collected meanwhile: upload it instead
        _log.debug("file not reused from the base version", path=path, base=base.version, error=str(exc))
        return None
    return ManifestFile(path=path, size=size, sha256=stored.sha256)


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _upload(store: ArtifactStore, prefix: str, path: str, source: Path | Reader) -> ManifestFile:
    info: ObjectInfo
    if isinstance(source, Path):
        info = store.put_file(prefix + path, source)
    else:
        info = store.put_stream(prefix + path, source)
    return ManifestFile(path=path, size=info.size, sha256=info.sha256)


def _discard(store: ArtifactStore, name: str, version: int) -> None:
    # Best effort: the original error matters more, and a leftover without a manifest is invisible and is removed
    # by the next publication of this version or by gc.
    try:
        deleted = store.delete_prefix(version_prefix(name, version))
        _log.warning("publication failed, partial files deleted", name=name, version=version, keys=deleted)
    except StoreError as exc:
        _log.warning("publication failed, partial files left", name=name, version=version, error=str(exc))


def _scan(store: ArtifactStore, name: str) -> tuple[list[int], set[int]]:
    """Complete versions of ``name`` (ascending) and every version that has any key, from one listing."""
    root = validate_name(name) + "/"
    complete: set[int] = set()
    present: set[int] = set()
    for key in store.list(root):
        parts = key[len(root) :].split("/")
        match = _VERSION_DIR.fullmatch(parts[0])
        if match is None or len(parts) < 2:
            continue  # another artifact nested under this name, e.g. '<name>/eval/...'
        present.add(int(match.group(1)))
        if parts[1:] == [MANIFEST_NAME]:
            complete.add(int(match.group(1)))
    return sorted(complete), present


def list_versions(store: ArtifactStore, name: str) -> list[int]:
    """Complete versions of ``name`` (those whose manifest exists), ascending."""
    return _scan(store, name)[0]


def latest_version(store: ArtifactStore, name: str) -> int | None:
    """The newest complete version of ``name``, or ``None`` if none was published."""
    versions = list_versions(store, name)
    return versions[-1] if versions else None


def read_manifest(store: ArtifactStore, name: str, version: int, sha256: str | None = None) -> Manifest:
    """The manifest of ``version`` of ``name``; ``ArtifactNotFoundError`` if that version does not exist, and
    ``IntegrityError`` if ``sha256`` is given and the manifest's bytes have another."""
    key = manifest_key(name, version)
    try:
        data = store.get_bytes(key)
    except ArtifactNotFoundError as exc:
        raise ArtifactNotFoundError(f"{name} v{version} does not exist in {store.location} (no manifest)") from exc
    if sha256 is not None and (actual := hashlib.sha256(data).hexdigest()) != sha256:
        raise IntegrityError(f"manifest of {name} v{version} has sha256 {actual}, expected {sha256}")
    manifest = Manifest.from_json(data, source=f"{store.location}/{key}")
    if (manifest.name, manifest.version) != (name, version):
        raise IntegrityError(f"{store.location}/{key} describes {manifest.name} v{manifest.version}")
    return manifest


def read_version_files(store: ArtifactStore, manifest: Manifest) -> dict[str, bytes]:
    """Every file of the version ``manifest`` describes, in memory (path -> content), each checked against the
    manifest's size and sha256 (``IntegrityError``): a version small enough to hold in memory, nothing written."""
    prefix = version_prefix(manifest.name, manifest.version)
    files: dict[str, bytes] = {}
    for entry in manifest.files:
        key = prefix + entry.path
        digest, chunks, size = hashlib.sha256(), [], 0
        with store.open_read(key) as reader:
            for chunk in reader:
                size += len(chunk)
                if size > entry.size:  # never hold more than the manifest says
                    raise IntegrityError(f"{key!r}: expected {entry.size} bytes, got more")
                digest.update(chunk)
                chunks.append(chunk)
        if size != entry.size:
            raise IntegrityError(f"{key!r}: expected {entry.size} bytes, got {size}")
        if (actual := digest.hexdigest()) != entry.sha256:
            raise IntegrityError(f"{key!r}: expected sha256 {entry.sha256}, got {actual}")
        files[entry.path] = b"".join(chunks)
    return files


def download_version(
    store: ArtifactStore,
    name: str,
    version: int,
    dest_dir: Path,
    verify: bool = True,
    *,
    manifest: Manifest | None = None,
    durable: bool = True,
) -> Manifest:
    """Stream every file of a version into ``dest_dir``, then write its ``manifest.json`` there last.

    With ``verify`` each file's size and sha256 are checked while it streams down; a mismatch raises
    ``IntegrityError``. On any failure the files this call wrote are removed, so a directory holding a
    ``manifest.json`` is always a complete download. Existing files of the same paths are replaced. ``manifest``:
    the version's, already read (``read_manifest``). ``durable=False`` skips the fsyncs, for a scratch download
    that is deleted once used.
    """
    if manifest is None:
        manifest = read_manifest(store, name, version)
    elif (manifest.name, manifest.version) != (name, version):
        raise ValueError(f"the manifest given is {manifest.name} v{manifest.version}, not {name} v{version}")
    dest = Path(dest_dir)
    prefix = version_prefix(name, version)
    written: list[Path] = []
    start = perf_counter()
    try:
        _remove(dest / MANIFEST_NAME)  # the directory is not a complete download until we say so again
        for entry in manifest.files:
            target = dest.joinpath(*entry.path.split("/"))
            expected = (entry.sha256, entry.size) if verify else (None, None)
            store.get_file(prefix + entry.path, target, sha256=expected[0], size=expected[1], durable=durable)
            written.append(target)
        atomic_write(dest / MANIFEST_NAME, [manifest.to_json()], durable=durable)
    except Exception:
        for path in written:
            with suppress(OSError):
                path.unlink()
        raise
    _log.info(
        "version downloaded",
        location=store.location,
        name=name,
        version=version,
        dest=str(dest),
        size=manifest.total_size,
        seconds=round(perf_counter() - start, 3),
    )
    return manifest


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot remove {path}: {exc}") from exc


def gc(store: ArtifactStore, name: str, keep_last: int) -> list[int]:
    """Delete all but the newest ``keep_last`` complete versions of ``name``, and abandoned incomplete ones.

    An incomplete version (files, no manifest) is deleted only when older than the newest complete version: a
    newer one may be a publication in progress. A complete version loses its manifest first, so it stops
    existing before its files go. Returns the deleted version numbers, ascending.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be at least 1 (the version engines are serving), got {keep_last}")
    complete, present = _scan(store, name)
    doomed = complete[:-keep_last]
    newest = complete[-1] if complete else -1
    abandoned = sorted(v for v in present.difference(complete) if v < newest)
    for version in doomed:
        store.delete(manifest_key(name, version))
        store.delete_prefix(version_prefix(name, version))
    for version in abandoned:
        store.delete_prefix(version_prefix(name, version))
    deleted = sorted(doomed + abandoned)
    if deleted:
        _log.info("versions deleted", location=store.location, name=name, deleted=deleted, kept=complete[-keep_last:])
    return deleted
