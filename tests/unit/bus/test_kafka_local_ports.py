"""The local services' default ports lie below the kernel's ephemeral range, so a killed broker can restart on them."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType


def test_default_kafka_and_s3_ports_are_below_the_ephemeral_range(local_services: ModuleType) -> None:
    low, _ = local_services.ephemeral_port_range()
    kafka = local_services._kafka_ports(local_services.DEFAULT_KAFKA_PORT_BASE, 3)
    s3 = local_services._s3_ports(local_services.DEFAULT_S3_PORT_BASE)
    assert [port for port in kafka + s3 if port >= low] == []
    assert min(kafka + s3) >= 1024  # not privileged either


def test_ephemeral_range_is_read_from_proc_and_falls_back_to_linux_default(
    local_services: ModuleType, tmp_path: Path
) -> None:
    custom = tmp_path / "ip_local_port_range"
    custom.write_text("20000\t40000\n")
    assert local_services.ephemeral_port_range(custom) == (20000, 40000)
    assert local_services.ephemeral_port_range(tmp_path / "missing") == (32768, 60999)
