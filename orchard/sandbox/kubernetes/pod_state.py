"""Reading episode pods back from the cluster: whether a pod is live, when it expires, and whether its container
runs, may still start, or never will."""

from __future__ import annotations

import math
from typing import Literal

from kubernetes import client

from orchard.sandbox.kubernetes.objects import ANNOTATION_EXPIRES_AT

FATAL_WAITING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
"""Container waiting reasons that fail ``create`` at once (the scheduler retries the episode) instead of waiting."""


def pod_is_live(pod: client.V1Pod) -> bool:
    """Neither finished nor being deleted."""
    phase = pod.status.phase if pod.status is not None else None
    return pod.metadata.deletion_timestamp is None and phase in (None, "Pending", "Running")


def pod_expires_at(pod: client.V1Pod) -> float:
    """The ``orchard.dev/expires-at`` annotation (infinity when missing: ``activeDeadlineSeconds`` still holds)."""
    raw = (pod.metadata.annotations or {}).get(ANNOTATION_EXPIRES_AT)
    try:
        return float(raw)
    except (TypeError, ValueError):
        return math.inf


def pod_start_state(pod: client.V1Pod) -> tuple[Literal["running", "starting", "failed"], str]:
    """Whether the sandbox container runs, may still start, or never will; and a description of why."""
    status = pod.status
    if status is None:
        return "starting", "no status yet"
    if status.phase in ("Succeeded", "Failed"):
        return "failed", f"{status.phase} before it ran {status.reason or ''}".strip()
    for container in status.container_statuses or []:
        state = container.state
        if state is not None and state.running is not None and status.phase == "Running":
            return "running", "running"
        if state is not None and state.waiting is not None and state.waiting.reason in FATAL_WAITING_REASONS:
            return "failed", f"{state.waiting.reason}: {state.waiting.message or ''}".strip()
    conditions = ", ".join(
        f"{c.type}={c.status} {c.reason or ''} {c.message or ''}".strip() for c in status.conditions or []
    )
    return "starting", f"phase {status.phase}; {conditions}"
