"""Where a run's artifacts live in the store: the names trainers publish under and engines and tools read from.

>>> policy_artifact_name("r1", "policy"), checkpoint_artifact_name("r1", "policy")
('runs/r1/policy', 'runs/r1/checkpoints/policy')
"""

from __future__ import annotations


def policy_artifact_name(run_id: str, model: str) -> str:
    """Where a run's policy versions live in the store."""
    return f"runs/{run_id}/{model}"


def checkpoint_artifact_name(run_id: str, model: str) -> str:
    """Where a run's trainer checkpoints of ``model`` live in the store."""
    return f"runs/{run_id}/checkpoints/{model}"
