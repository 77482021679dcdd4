"""One episode to start on Orchard Env (``POST /episodes``), and the function that submits it.

The rollout scheduler (``producers.rollout``) and the held-out evaluation (``orchard.evaluation.heldout``) both plan
episodes as ``EpisodeRequest`` values and hand them to a ``SubmitFn``: ``producers.rollout.scheduler.EnvSubmitter``
against a running Env, a list's ``append`` in tests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class EpisodeRequest:
    """One episode to start: the fields of Orchard Env's ``POST /episodes`` body."""

    task_id: str
    group_id: str
    episode_id: str
    harness: str
    model: str
    timeout_s: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def submission(self) -> dict[str, Any]:
        """The JSON body of ``POST /episodes`` (``orchard.env.service.EpisodeSubmission``)."""
        return {
            "task_id": self.task_id,
            "harness": self.harness,
            "model": self.model,
            "episode_id": self.episode_id,
            "group_id": self.group_id,
            "timeout_s": self.timeout_s,
            "options": dict(self.options),
        }


SubmitFn = Callable[[EpisodeRequest], None]


def episode_seed(seed: int, episode_id: str) -> int:
    """The sampling seed of episode ``episode_id`` under a run-level ``seed``: 63 bits of a hash of both."""
    digest = hashlib.blake2b(f"{seed}\0{episode_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def seeded_options(options: Mapping[str, Any], seed: int | None, episode_id: str) -> dict[str, Any]:
    """``options`` with the harness's sampling seed for ``episode_id`` (``episode_seed``); as they are without one.

    Episode ids are derived from run, round or stage, and task, so a rerun gives every episode the seed it had."""
    if seed is None:
        return dict(options)
    return {**options, "harness": {**dict(options.get("harness") or {}), "seed": episode_seed(seed, episode_id)}}
