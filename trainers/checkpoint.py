"""Trainer checkpoints in the store: model, optimizer, scheduler, RNG states, and the bus offsets trained up to.

A checkpoint is a versioned artifact ``runs/<run>/checkpoints/<model>``, version = optimizer step, with two files:
``state.pt`` (tensors: model, optimizer and scheduler state dicts, torch RNG states; read back with
``weights_only=True``) and ``state.json`` (step, policy version, offsets, counters, python and numpy RNG states). The
manifest is written last (``orchard.store.versions``), so a checkpoint exists completely or not at all.

The offsets are, per topic partition, the next offset *after the last record that went into an optimizer step*
(records still buffered for a later step are not covered). A restarted trainer loads the newest checkpoint and seeks
its consumer to those offsets: nothing is trained twice, nothing skipped.

A trainer with ``epochs > 1`` also records the pass it is in (``epoch``, from 0), the offsets its stage started from
(``epoch_start``, where each pass seeks back to) and, from the second pass on, the offsets the first pass ended at
(``epoch_end``): a restart mid-pass resumes that pass where it was. Between stages (a single-pass trainer, or a
finished multi-pass one) these are ``0, None, None``, so the next trainer starts its own stage at ``offsets``.

A trainer with a complete input (``input: complete``) trains its stage's samples in an order of their own, not in
offset order, so during its stage ``offsets`` stay at the stage's start (``epoch_start``), ``epoch_end`` is where its
samples end (from the first pass on) and ``pass_position`` counts the samples of the current pass already trained:
a restart reads the same samples, orders them the same way and skips that many. Its stage over, it checkpoints
"between stages" like any other, with ``offsets`` at the end of its samples.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orchard.artifacts import checkpoint_artifact_name
from orchard.logging import get_logger
from orchard.store import ArtifactStore, VersionExistsError
from trainers.exceptions import CheckpointError

log = get_logger("trainers.checkpoint")

STATE_TENSORS = "state.pt"
STATE_JSON = "state.json"
Offsets = dict[str, dict[int, int]]
"""topic -> partition -> next offset to read."""


def copy_offsets(offsets: Offsets) -> Offsets:
    """A copy that shares no dict with ``offsets``."""
    return {topic: dict(parts) for topic, parts in offsets.items()}


@dataclass
class TrainerState:
    """The plain-data part of a checkpoint."""

    step: int
    policy_version: int
    offsets: Offsets
    counters: dict[str, float] = field(default_factory=dict)
    python_rng: Any = None
    numpy_rng: Any = None
    epoch: int = 0
    epoch_start: Offsets | None = None
    epoch_end: Offsets | None = None
    pass_position: int = 0
    """With a complete input: how many samples of the current pass, in its order, are trained."""
    trainer: str | None = None
    """Which trainer wrote it (its run directory): a restart of the same trainer, or a recipe's next stage."""
    round: int | None = None
    """With lockstep rounds (``input: rounds``): the newest rollout round trained."""

    def to_json(self) -> bytes:
        """Serialise (partition keys become strings, as JSON requires)."""
        data = asdict(self)
        for key in _OFFSET_FIELDS:
            if data[key] is not None:
                data[key] = {t: {str(p): o for p, o in parts.items()} for t, parts in data[key].items()}
        return json.dumps(data, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> TrainerState:
        """Parse what ``to_json`` wrote (a checkpoint from before ``epoch`` existed reads as pass 0)."""
        data = json.loads(raw)
        for key in _OFFSET_FIELDS:
            if data.get(key) is not None:
                data[key] = {t: {int(p): int(o) for p, o in parts.items()} for t, parts in data[key].items()}
        return cls(**data)


_OFFSET_FIELDS = ("offsets", "epoch_start", "epoch_end")


@dataclass
class Checkpoint:
    """A loaded checkpoint: tensors (state dicts, torch RNG) and the plain state."""

    tensors: dict[str, Any]
    state: TrainerState


def capture_rng() -> tuple[dict[str, Any], Any, Any]:
    """Torch RNG states (tensors), and the python and numpy RNG states as JSON-able values."""
    tensors: dict[str, Any] = {"torch_rng": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda_rng"] = torch.cuda.get_rng_state_all()
    py_version, py_state, py_gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002 - the global RNG is what users seed
    numpy_rng = [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    return tensors, [py_version, list(py_state), py_gauss], numpy_rng


def restore_rng(tensors: dict[str, Any], python_rng: Any, numpy_rng: Any) -> None:
    """Put back what ``capture_rng`` took."""
    torch.set_rng_state(tensors["torch_rng"])
    if "cuda_rng" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(tensors["cuda_rng"])
    if python_rng is not None:
        random.setstate((python_rng[0], tuple(python_rng[1]), python_rng[2]))
    if numpy_rng is not None:
        kind, keys, pos, has_gauss, cached = numpy_rng
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))  # noqa: NPY002


class CheckpointStore:
    """Saves and loads one trainer's checkpoints in the artifact store, keeping the newest ``keep``."""

    def __init__(self, store: ArtifactStore, run_id: str, model: str, scratch_dir: Path, keep: int = 2) -> None:
        self.store = store
        self.name = checkpoint_artifact_name(run_id, model)
        self.scratch_dir = scratch_dir
        self.keep = keep

    def save(self, tensors: dict[str, Any], state: TrainerState, *, advance: bool = False) -> bool:
        """Write a checkpoint for ``state.step``; False if that step is already checkpointed (same state).

        With ``advance`` the checkpoint is stored under a number above every one stored, at least the step: a
        state that changed without a step (a lockstep round that gave nothing to train still moves the offsets,
        the round and the version) must not be lost to the "already checkpointed" rule. ``state.step`` inside it
        stays the optimizer step."""
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="checkpoint-", dir=self.scratch_dir))
        number = max(state.step, (self.latest_step() or -1) + 1) if advance else state.step
        try:
            torch.save(tensors, work / STATE_TENSORS)
            (work / STATE_JSON).write_bytes(state.to_json())
            files = {STATE_TENSORS: work / STATE_TENSORS, STATE_JSON: work / STATE_JSON}
            self.store.publish_version(self.name, number, files, {"policy_version": state.policy_version})
        except VersionExistsError:
            log.info("step already checkpointed", step=state.step)
            return False
        finally:
            shutil.rmtree(work, ignore_errors=True)
        removed = self.store.gc(self.name, self.keep)
        log.info("checkpoint saved", step=state.step, offsets=state.offsets, removed=removed)
        return True

    def latest_step(self) -> int | None:
        """Step of the newest complete checkpoint, or None."""
        return self.store.latest_version(self.name)

    def load_latest(self, map_location: str | torch.device = "cpu") -> Checkpoint | None:
        """The newest checkpoint, or None if there is none."""
        step = self.latest_step()
        if step is None:
            return None
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="restore-", dir=self.scratch_dir))
        try:
            self.store.download_version(self.name, step, work, verify=True)
            tensors = torch.load(work / STATE_TENSORS, map_location=map_location, weights_only=True)
            state = TrainerState.from_json((work / STATE_JSON).read_bytes())
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"cannot read checkpoint {self.name} step {step}: {exc}") from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log.info("checkpoint loaded", step=step, offsets=state.offsets, policy_version=state.policy_version)
        return Checkpoint(tensors, state)
