"""Publishing a policy version: files to the store (manifest last), then a ``PolicyVersion`` record to the bus.

The record is sent only after the manifest exists, so an engine that sees the record can always fetch the
version; the record carries the sha256 of the manifest document, which lists every file's own sha256.

A version re-published after a crash (the previous process published it after its last checkpoint) already exists
in the store: ``WeightPublisher`` keeps the stored files and announces the version again (engines ignore versions
that are not newer than the one they serve).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchard.artifacts import policy_artifact_name
from orchard.bus import Producer
from orchard.clock import now_ms
from orchard.codec import Codec
from orchard.logging import get_logger
from orchard.store import ArtifactStore, Manifest, StoreError
from orchard.store.versions import manifest_key
from orchard.topics import POLICY_VERSIONS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = get_logger("trainers.weights")


class WeightPublisher:
    """Publishes one trainer's versions, keeping what does not change between them.

    Each version is ``export``'s files (written into a fresh directory under ``scratch``) plus the tokenizer's
    (AutoTokenizer loads a published version as AutoModel does), which are saved once, not per version. The manifest
    of the version it published last is the base whose unchanged files the next one copies inside the store; after a
    restart the previous version's manifest is read back instead. A version already in the store (published by an
    earlier process of the trainer after its last checkpoint) is announced again, its files kept.
    """

    def __init__(
        self,
        store: ArtifactStore,
        export: Callable[[Path], dict[str, Path]],
        tokenizer: PreTrainedTokenizerBase | None,
        *,
        scratch: Path,
        run_id: str,
        model: str,
        codec: Codec,
    ) -> None:
        self.store, self.export, self.tokenizer = store, export, tokenizer
        self.scratch, self.run_id, self.model, self.codec = scratch, run_id, model, codec
        self.name = policy_artifact_name(run_id, model)
        self._tokenizer_files: dict[str, Path] | None = None
        self._last: Manifest | None = None

    def publish(self, producer: Producer, *, version: int, step: int, metrics: Mapping[str, float]) -> None:
        """Publish the weights ``export`` writes now as ``version`` (or announce it again if already stored)."""
        if self.store.exists(manifest_key(self.name, version)):
            announce_published_version(self.store, producer, run_id=self.run_id, model=self.model, version=version,
                                       step=step, codec=self.codec)  # fmt: skip
            return
        self.scratch.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"export-v{version}-", dir=self.scratch))
        try:
            files = {**self.export(work), **self._tokenizer()}
            self._last, _ = publish_policy_version(
                self.store, producer, run_id=self.run_id, model=self.model, version=version, files=files,
                trainer_step=step, metrics=metrics, codec=self.codec, base=self._base(version),
            )  # fmt: skip
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _tokenizer(self) -> dict[str, Path]:
        if self.tokenizer is None:
            return {}
        files = self._tokenizer_files
        if files is None or not all(path.is_file() for path in files.values()):  # first use, or cleaned away
            # a directory of this process's own: another trainer on the same run_dir never rewrites it mid-upload
            self.scratch.mkdir(parents=True, exist_ok=True)
            directory = Path(tempfile.mkdtemp(prefix="tokenizer-", dir=self.scratch))
            self.tokenizer.save_pretrained(directory)
            self._tokenizer_files = {p.name: p for p in sorted(directory.iterdir()) if p.is_file()}
        return self._tokenizer_files

    def _base(self, version: int) -> Manifest | None:
        """The previous version's manifest, whose unchanged files (configs, tokenizer) the new one reuses; None for
        the first version or when it is gone (collected, or never published by this store)."""
        if self._last is not None and self._last.version == version - 1:
            return self._last
        if version <= 1:
            return None
        try:
            return self.store.read_manifest(self.name, version - 1)
        except StoreError:
            return None


def publish_policy_version(
    store: ArtifactStore,
    producer: Producer,
    *,
    run_id: str,
    model: str,
    version: int,
    files: Mapping[str, Path],
    trainer_step: int,
    metrics: Mapping[str, float] | None = None,
    codec: Codec | None = None,
    topic: str = POLICY_VERSIONS,
    base: Manifest | None = None,
) -> tuple[Manifest, dict[str, Any]]:
    """Upload ``files`` as ``version`` and announce it; return the manifest and the record sent (acknowledged).
    Files ``base`` (an earlier version) already holds are copied inside the store (``publish_version``)."""
    name = policy_artifact_name(run_id, model)
    meta = {"trainer_step": trainer_step, **dict(metrics or {})}
    manifest = store.publish_version(name, version, files, meta, base=base)
    record = _version_record(store, run_id, model, version, trainer_step, metrics or {}, manifest.to_json())
    producer.send(topic, (codec or Codec.default()).encode("PolicyVersion", record), key=model.encode())
    return manifest, record


def _version_record(
    store: ArtifactStore,
    run_id: str,
    model: str,
    version: int,
    trainer_step: int,
    metrics: Mapping[str, float],
    manifest_document: bytes | None = None,
) -> dict[str, Any]:
    """The PolicyVersion record of ``version``, already in the store: the sha256 of its manifest document, as just
    written (``manifest_document``) or read back from the store."""
    key = manifest_key(policy_artifact_name(run_id, model), version)
    document = manifest_document if manifest_document is not None else store.get_bytes(key)
    return {
        "run_id": run_id,
        "model": model,
        "version": version,
        "uri": f"{store.location}/{key}",
        "sha256": hashlib.sha256(document).hexdigest(),
        "trainer_step": trainer_step,
        "metrics": dict(metrics),
        "created_at": now_ms(),
    }


def announce_published_version(
    store: ArtifactStore,
    producer: Producer,
    *,
    run_id: str,
    model: str,
    version: int,
    step: int,
    codec: Codec | None = None,
) -> int | None:
    """Announce ``version``, already in the store (an earlier process of the trainer published it after its last
    checkpoint), with the step its manifest records (else ``step``); return the recorded step, if any."""
    name = policy_artifact_name(run_id, model)
    metadata = store.read_manifest(name, version).metadata
    stored_step = metadata.get("trainer_step")
    recorded = int(stored_step) if isinstance(stored_step, int) else None
    # its metrics as published (a lockstep round's tag among them: a rollout waits for it)
    metrics = {key: float(value) for key, value in metadata.items()
               if key != "trainer_step" and isinstance(value, int | float) and not isinstance(value, bool)}  # fmt: skip
    log.warning("version already published by an earlier run of this trainer; keeping it and announcing it again",
                version=version, step=step, stored_step=recorded)  # fmt: skip
    record = _version_record(store, run_id, model, version, recorded if recorded is not None else step, metrics)
    producer.send(POLICY_VERSIONS, (codec or Codec.default()).encode("PolicyVersion", record), key=model.encode())
    return recorded
