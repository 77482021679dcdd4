"""A Kafka bus whose broker does not answer fails at start, clearly and within its connect timeout."""

from __future__ import annotations

import socket
import time

import pytest

from orchard.bus import BusUnavailableError
from orchard.bus.kafka import KafkaBus
from orchard.config import KafkaBusConfig


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_broker_fails_at_start_within_the_connect_timeout() -> None:
    address = f"127.0.0.1:{closed_port()}"
    started = time.monotonic()
    with pytest.raises(BusUnavailableError, match=f"no Kafka broker answered at {address} within 2s"):
        KafkaBus(KafkaBusConfig(bootstrap_servers=address, connect_timeout_s=2))
    assert time.monotonic() - started < 6
