"""Wait until an engine serves a policy version at least as new as the newest one published.

A training stage ends when its trainer has published; an engine started with ``--reload`` picks the new weights up a
moment later. Evaluating in between would measure the previous policy under the new stage's name, so an evaluation
first waits until the engine's ``/healthz`` reports a ``policy_version`` at least the newest published one.
``orchard eval --wait-for-engine URL`` reads the newest version from the run's bus (``orchard.run.stages``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from orchard.logging import get_logger

log = get_logger("evaluation.engine_wait")
POLL_S = 0.5
"""Seconds between two looks at the engine and the newest version."""


def served_version(engine: str, client: httpx.Client) -> int | None:
    """The policy version the engine at ``engine`` reports serving (None while it does not answer)."""
    try:
        response = client.get(f"{engine.rstrip('/')}/healthz")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        version = response.json().get("policy_version")
        return int(version) if version is not None else None
    except (ValueError, AttributeError, TypeError):  # not an Orchard engine's health answer: not serving one
        return None


def wait_until_served(
    engine: str, newest: Callable[[], int | None], timeout_s: float, poll_s: float = POLL_S
) -> int | None:
    """Wait until ``engine`` serves a version at least ``newest()`` (None: nothing published, so any); return the
    version it serves, or None if it does not get there within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            target = newest() or 0
            serving = served_version(engine, client)
            if serving is not None and serving >= target:
                log.info("engine serves the newest policy", policy_version=serving, newest=target)
                return serving
            time.sleep(poll_s)
    log.error("engine did not serve the newest policy in time", engine=engine, timeout_s=timeout_s)
    return None
