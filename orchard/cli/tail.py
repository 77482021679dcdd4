"""``orchard tail TOPIC``: records decoded to JSON lines, from an offset or a time, optionally following."""

from __future__ import annotations

import base64
import json
import re
import sys
import time
from datetime import UTC, datetime
from typing import Any

import typer

from orchard.bus import Consumer, Record, TopicPartition
from orchard.cli.common import state
from orchard.codec import Codec
from orchard.serialization_errors import SerializationError

RELATIVE_TIME = re.compile(r"^-(\d+)([smhd])$")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str) -> int:
    """Milliseconds since the epoch from ISO 8601, epoch milliseconds, or a relative ``-10m`` / ``-2h``."""
    if text.isdigit():
        return int(text)
    relative = RELATIVE_TIME.match(text)
    if relative:
        return int((time.time() - int(relative.group(1)) * UNIT_SECONDS[relative.group(2)]) * 1000)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r} is not ISO 8601, epoch milliseconds, or -N[smhd]") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def render(record: Record, codec: Codec) -> dict[str, Any]:
    """One record as a JSON-ready dict: position, key, schema and decoded fields (or the decode error)."""
    line: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp_ms,
        "key": None if record.key is None else record.key.decode("utf-8", "backslashreplace"),
    }
    try:
        decoded = codec.decode(record.value)
    except SerializationError as exc:
        line["error"] = f"{type(exc).__name__}: {exc}"
        line["raw_base64"] = base64.b64encode(record.value[:256]).decode()
        return line
    line["schema"] = f"{decoded.name}/v{decoded.writer_version}"
    line["record"] = codec.to_json_dict(decoded)
    return line


def tail(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="Topic to read."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep waiting for new records."),
    from_offset: int | None = typer.Option(None, "--from-offset", min=0, help="Start every partition here."),
    from_time: str | None = typer.Option(None, "--from-time", help="Start at a time: ISO 8601, epoch ms, or -10m."),
    partition: int | None = typer.Option(None, "--partition", min=0, help="Only this partition."),
    max_records: int | None = typer.Option(None, "--max-records", "-n", min=1, help="Stop after this many."),
) -> None:
    """Print a topic's records as JSON lines (token arrays unpacked); from the start unless told otherwise."""
    bus = state(ctx).bus()
    codec = Codec.default()
    consumer = bus.consumer([topic])
    try:
        ends = bus.describe_topic(topic).end_offsets
        _position(consumer, topic, ends, from_offset, from_time, partition)
        printed, idle_polls = 0, 0
        while max_records is None or printed < max_records:
            batch = consumer.poll(max_records=500, timeout_s=0.5)
            idle_polls = 0 if batch else idle_polls + 1
            for record in batch:
                if partition is not None and record.partition != partition:
                    continue
                sys.stdout.write(json.dumps(render(record, codec), default=str) + "\n")
                printed += 1
                if max_records is not None and printed >= max_records:
                    break
            sys.stdout.flush()
            # Transaction markers take offsets no record has, so positions may stop short of the end offsets:
            # two empty polls in a row also mean the end.
            if not follow and (_reached(consumer.position(), ends, partition) or idle_polls >= 2):
                break
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
        bus.close()


def _position(
    consumer: Consumer,
    topic: str,
    ends: dict[int, int],
    from_offset: int | None,
    from_time: str | None,
    partition: int | None,
) -> None:
    if from_offset is not None and from_time is not None:
        raise typer.BadParameter("give --from-offset or --from-time, not both")
    if from_time is not None:
        consumer.seek_to_timestamp(parse_time(from_time))
    elif from_offset is not None:
        for p in ends:
            if partition is None or p == partition:
                consumer.seek(TopicPartition(topic, p), from_offset)


def _reached(positions: dict[TopicPartition, int], ends: dict[int, int], partition: int | None) -> bool:
    wanted = {p: end for p, end in ends.items() if partition is None or p == partition}
    current = {tp.partition: off for tp, off in positions.items()}
    return all(current.get(p, 0) >= end for p, end in wanted.items())
