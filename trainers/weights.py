"""Publishing a policy version: files to the store (manifest last), then a ``PolicyVersion`` record to the bus.

The record is sent only after the manifest exists, so an engine that sees the record can always fetch the
version; the record carries the sha256 of the manifest document, which lists every file's own sha256.

A version re-published after a crash (the previous process published it after its last checkpoint) already exists
in the store: ``publish_weights`` keeps the stored files and announces the version again (engines ignore versions
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


def publish_weights(
    store: ArtifactStore,
    producer: Producer,
    export: Callable[[Path], dict[str, Path]],
    tokenizer: PreTrainedTokenizerBase | None,
    *,
    scratch: Path,
    run_id: str,
    model: str,
    version: int,
    step: int,
    metrics: Mapping[str, float],
    codec: Codec,
) -> None:
    """Publish a trainer's weights as ``version``: ``export`` writes them (the tokenizer is saved beside them) into a
    directory under ``scratch``, which is uploaded and announced; a version already in the store is announced again."""
    scratch.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"export-v{version}-", dir=scratch))
    try:
        name = policy_artifact_name(run_id, model)
        if store.exists(manifest_key(name, version)):
            announce_published_version(store, producer, run_id=run_id, model=model, version=version, step=step,
                                       codec=codec)  # fmt: skip
        else:
            files = export(work)
            if tokenizer is not None:  # AutoTokenizer loads a published version as AutoModel does
                tokenizer.save_pretrained(work)
                files = {p.name: p for p in sorted(work.iterdir()) if p.is_file()}
            publish_policy_version(
                store, producer, run_id=run_id, model=model, version=version, files=files, trainer_step=step,
                metrics=metrics, codec=codec, base=_previous_manifest(store, name, version),
            )  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


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
    record = _version_record(store, run_id, model, version, trainer_step, metrics or {})
    producer.send(topic, (codec or Codec.default()).encode("PolicyVersion", record), key=model.encode())
    return manifest, record


def _previous_manifest(store: ArtifactStore, name: str, version: int) -> Manifest | None:
    """The manifest of the version before ``version``, whose unchanged files (configs, tokenizer) the new one
    reuses; None for the first version or when it is gone (collected, or never published by this store)."""
    if version <= 1:
        return None
    try:
        return store.read_manifest(name, version - 1)
    except StoreError:
        return None


def _version_record(
    store: ArtifactStore, run_id: str, model: str, version: int, trainer_step: int, metrics: Mapping[str, float]
) -> dict[str, Any]:
    """The PolicyVersion record of ``version``, already in the store (its manifest's sha256 read back from it)."""
    key = manifest_key(policy_artifact_name(run_id, model), version)
    return {
        "run_id": run_id,
        "model": model,
        "version": version,
        "uri": f"{store.location}/{key}",
        "sha256": hashlib.sha256(store.get_bytes(key)).hexdigest(),
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
