"""The Kafka broker a bus benchmark measures: the one ``ORCHARD_KAFKA_BOOTSTRAP`` names, or a node of its own."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def start_kafka() -> tuple[str, Callable[[], None]]:
    """A broker for the benchmark: ORCHARD_KAFKA_BOOTSTRAP, or one started (and stopped) here."""
    if os.environ.get("ORCHARD_KAFKA_BOOTSTRAP"):
        return os.environ["ORCHARD_KAFKA_BOOTSTRAP"], lambda: None
    # infra/local is not a package: its services module is loaded by path
    spec = importlib.util.spec_from_file_location("orchard_services", REPO / "infra" / "local" / "services.py")
    assert spec is not None and spec.loader is not None
    services = importlib.util.module_from_spec(spec)
    sys.modules["orchard_services"] = services
    spec.loader.exec_module(services)
    service = services.kafka_up(name="bench-kafka")
    return service.bootstrap, lambda: services.kafka_down(name="bench-kafka", purge=True)
