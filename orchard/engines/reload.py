"""Hot reload: follow ``policy-versions``, fetch each new version from the store, verify it, and serve it.

``PolicyReloader`` runs one background thread with a group-less consumer of ``policy-versions`` that starts at the
end of the topic (an engine serves what is published from now on; with ``catch_up`` it first loads the newest
version already in the store). For each ``PolicyVersion`` of its run and model that is newer than the version
served (only the newest of a polled batch is applied), it:

1. reads the version's manifest and checks that its sha256 is the record's ``sha256`` (the record names exactly
   this manifest, which lists every file's own sha256);
2. reads every file and checks its size and sha256: into memory for a version up to ``in_memory_bytes`` (256
   MiB) when the engine ``loads_from_memory``, handed to its ``load_version_files``; otherwise, or when the engine
   cannot take that version from memory, it streams to a scratch directory (``download_version(verify=True)``, no
   fsyncs: it is deleted once loaded), handed to ``load_version`` (``orchard.engines.base.Engine``);
3. the local engine copies the weights into a *copy* of the served model (from memory; from a directory it builds a
   new model instance), checking that every tensor is present, with no extra ones, the same shapes and vocabulary,
   and installs it between two steps, requests already running finishing on the weights they started with; the
   vLLM backend drains and swaps (``orchard.engines.vllm_backend``).

Any failure (a tampered or partial artifact, a missing manifest, weights that do not load) is logged as an error
with the version and the reason, counted in ``refused``, and the engine keeps serving the version it had.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchard.artifacts import policy_artifact_name
from orchard.bus import Bus, Consumer, open_bus
from orchard.codec import Codec
from orchard.engines.base import Engine
from orchard.engines.exceptions import EngineError
from orchard.logging import get_logger
from orchard.serialization_errors import SerializationError
from orchard.store import ArtifactStore, open_store
from orchard.store.manifest import Manifest
from orchard.topics import POLICY_VERSIONS, TOPICS_BY_NAME

if TYPE_CHECKING:
    from orchard.config import OrchardConfig
    from orchard.engines.config import PolicyUpdatesConfig

log = get_logger("engines.reload")

# A version up to this size is read into memory and handed to the engine as bytes (the local engine then copies
# the weights into a copy of its model: no scratch files, no model built from its config); a larger one streams to a
# scratch directory the engine loads from.
IN_MEMORY_BYTES = 256 * 2**20


@dataclass
class ReloadEvent:
    """One version the reloader applied or refused, and how long it took from the record to the swap."""

    version: int
    applied: bool
    seconds: float
    reason: str = ""
    record_received_at: float = field(default_factory=time.time)


class PolicyReloader:
    """Applies new policy versions to an engine (any ``Engine``: its ``policy_version`` and ``load_version``); see
    the module docstring."""

    def __init__(
        self,
        engine: Engine,
        bus: Bus,
        store: ArtifactStore,
        *,
        run_id: str,
        model: str,
        catch_up: bool = True,
        max_version: int | None = None,
        download_dir: Path | None = None,
        poll_timeout_s: float = 0.5,
        codec: Codec | None = None,
        owns_backends: bool = False,
        in_memory_bytes: int = IN_MEMORY_BYTES,
    ) -> None:
        self.engine = engine
        self.bus = bus
        self.store = store
        self.run_id = run_id
        self.model = model
        self.catch_up = catch_up
        self.max_version = max_version
        self.download_dir = download_dir
        self.poll_timeout_s = poll_timeout_s
        self.codec = codec or Codec.default()
        self.events: list[ReloadEvent] = []
        self._owns_backends = owns_backends
        self.in_memory_bytes = in_memory_bytes
        self._artifact = policy_artifact_name(run_id, model)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def applied(self) -> list[int]:
        """Versions installed, in order."""
        return [e.version for e in self.events if e.applied]

    @property
    def refused(self) -> list[int]:
        """Versions refused, in order."""
        return [e.version for e in self.events if not e.applied]

    def start(self) -> None:
        """Subscribe (from the end of the topic) and start following in a background thread."""
        self.bus.create_topic(POLICY_VERSIONS, TOPICS_BY_NAME[POLICY_VERSIONS].partitions, exist_ok=True)
        consumer = self.bus.consumer([POLICY_VERSIONS], start="latest")
        if self.catch_up and self.max_version is not None:
            # a pinned version must be served before anyone is answered (the app starts this in its lifespan)
            self._poll_once(consumer, timeout_s=0.0)
            self._catch_up()
            if self.max_version > 0 and self.engine.policy_version == 0:
                consumer.close()
                raise EngineError(
                    f"no version <= {self.max_version} of {self._artifact} could be served (none stored, or it "
                    "failed to load); the engine does not start on the base weights"
                )
        self._thread = threading.Thread(target=self._run, args=(consumer,), name="orchard-reloader", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop following (a download in progress finishes first), and close the bus and store if owned."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._owns_backends:
            self.bus.close()
            self.store.close()

    def _run(self, consumer: Consumer) -> None:
        try:
            self._poll_once(consumer, timeout_s=0.0)  # takes the partition (Kafka assigns lazily) before catching up
            if self.catch_up and self.max_version is None:
                self._catch_up()
            while not self._stop.is_set():
                self._poll_once(consumer, self.poll_timeout_s)
        except Exception:
            log.exception("policy reloader stopped by an error; the engine keeps serving", model=self.model)
        finally:
            consumer.close()

    def _poll_once(self, consumer: Consumer, timeout_s: float) -> None:
        records = consumer.poll(max_records=64, timeout_s=timeout_s)
        newest = self._newest(self._decode(r.value) for r in records)
        if newest is not None:
            self.apply(int(newest["version"]), str(newest["sha256"]))

    def _decode(self, value: bytes) -> dict[str, Any] | None:
        try:
            decoded = self.codec.decode(value)
        except SerializationError as exc:
            log.error("undecodable record on policy-versions skipped", error=str(exc))
            return None
        if decoded.name != "PolicyVersion":
            log.error("record of another schema on policy-versions skipped", schema=decoded.name)
            return None
        return decoded.record

    def _newest(self, records: Any) -> dict[str, Any] | None:
        mine = [r for r in records if r and r["run_id"] == self.run_id and r["model"] == self.model]
        mine = [r for r in mine if self.max_version is None or int(r["version"]) <= self.max_version]
        newest = max(mine, key=lambda r: int(r["version"]), default=None)
        if newest is not None and int(newest["version"]) <= self.engine.policy_version:
            log.info("policy version not newer than the one served, ignored", version=newest["version"])
            return None
        return newest

    def _catch_up(self) -> None:
        latest = self.store.latest_version(self._artifact)
        if latest is not None and self.max_version is not None and latest > self.max_version:
            allowed = [v for v in self.store.list_versions(self._artifact) if v <= self.max_version]
            latest = max(allowed, default=None)
        if latest is not None and latest > self.engine.policy_version:
            log.info("catching up with the newest stored version", version=latest)
            self.apply(latest, None)

    def apply(self, version: int, manifest_sha256: str | None) -> bool:
        """Fetch, verify, load and install ``version``; on any failure log it, keep serving, return False."""
        start = time.perf_counter()
        try:
            manifest = self.store.read_manifest(self._artifact, version, manifest_sha256)
            in_memory = self.engine.loads_from_memory and manifest.total_size <= self.in_memory_bytes
            if not (in_memory and self.engine.load_version_files(self.store.read_version_files(manifest), version)):
                self._load_from_disk(manifest, version)
        except Exception as exc:  # whatever went wrong (store, integrity, weights, memory), keep serving
            seconds = time.perf_counter() - start
            self.events.append(ReloadEvent(version, False, seconds, reason=str(exc)))
            log.error(
                "policy version refused; still serving the previous one",
                version=version,
                serving=self.engine.policy_version,
                reason=str(exc),
            )
            return False
        seconds = time.perf_counter() - start
        self.events.append(ReloadEvent(version, True, seconds))
        log.info("policy version loaded", version=version, seconds=round(seconds, 3))
        return True

    def _load_from_disk(self, manifest: Manifest, version: int) -> None:
        if self.download_dir is not None:
            self.download_dir.mkdir(parents=True, exist_ok=True)
        target = Path(tempfile.mkdtemp(prefix=f"policy-v{version}-", dir=self.download_dir))
        try:
            # a scratch copy, deleted once loaded: no fsyncs
            self.store.download_version(self._artifact, version, target, manifest=manifest, durable=False)
            self.engine.load_version(target, version)
        finally:
            shutil.rmtree(target, ignore_errors=True)


def open_reloader(engine: Engine, config: PolicyUpdatesConfig, orchard_config: OrchardConfig) -> PolicyReloader:
    """A reloader on the bus and store of ``orchard_config`` (it closes them when stopped)."""
    bus = open_bus(orchard_config.bus)
    try:
        store = open_store(orchard_config.store)
    except BaseException:
        bus.close()
        raise
    return PolicyReloader(
        engine,
        bus,
        store,
        run_id=config.run_id or orchard_config.run_id,
        model=config.model,
        catch_up=config.catch_up,
        max_version=config.max_version,
        download_dir=config.download_dir,
        poll_timeout_s=config.poll_timeout_s,
        owns_backends=True,
    )
