"""``orchard tail TOPIC``: records as readable JSON lines (nested records decoded), from an offset or a time, the
last N, filtered by episode or task, optionally following."""

from __future__ import annotations

import heapq
import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

import typer

from orchard.bus import Consumer, Record, TopicPartition, read_until_quiet
from orchard.cli.common import state
from orchard.cli.record_json import Entry, RecordRenderer, TokenMode, field_value
from orchard.codec import Codec

RELATIVE_TIME = re.compile(r"^-(\d+)([smhd])$")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
POLL_RECORDS = 500
IDLE_POLLS_AT_END = 2


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


@dataclass(frozen=True)
class Selection:
    """Which records are printed: a partition, an episode id, a task id (None: any)."""

    partition: int | None = None
    episode: str | None = None
    task: str | None = None

    @property
    def by_field(self) -> bool:
        """Whether records must be decoded to be selected."""
        return self.episode is not None or self.task is not None

    def matches(self, entry: Entry, renderer: RecordRenderer) -> bool:
        """Whether ``entry`` is one of the selected records."""
        if self.partition is not None and entry.record.partition != self.partition:
            return False
        wanted = (("episode_id", self.episode), ("task_id", self.task))
        return all(value is None or field_value(renderer, entry, name) == value for name, value in wanted)


def tail(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="Topic to read."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep waiting for new records."),
    from_offset: int | None = typer.Option(None, "--from-offset", min=0, help="Start every partition here."),
    from_time: str | None = typer.Option(None, "--from-time", help="Start at a time: ISO 8601, epoch ms, or -10m."),
    partition: int | None = typer.Option(None, "--partition", min=0, help="Only this partition."),
    last: int | None = typer.Option(
        None, "--last", "-n", min=1, help="Only the last N records (newest by timestamp, printed oldest first)."
    ),
    episode: str | None = typer.Option(None, "--episode", help="Only records of this episode id."),
    task: str | None = typer.Option(None, "--task", help="Only records of this task id (records with a task_id)."),
    tokens: str = typer.Option("full", "--tokens", help="Packed token arrays: 'full' lists or a 'summary'."),
) -> None:
    """Print a topic's records as JSON lines: nested records (a trajectory's calls and outcome) decoded, JSON
    fields parsed, token arrays unpacked; every record from the start unless told otherwise."""
    if tokens not in ("full", "summary"):
        raise typer.BadParameter("--tokens is 'full' or 'summary'")
    if from_offset is not None and from_time is not None:
        raise typer.BadParameter("give --from-offset or --from-time, not both")
    bus = state(ctx).bus()
    codec = Codec.default()
    renderer = RecordRenderer(codec, cast(TokenMode, tokens))
    selection = Selection(partition, episode, task)
    consumer = bus.consumer([topic])
    try:
        ends = bus.describe_topic(topic).end_offsets
        _position(consumer, topic, ends, from_offset, from_time, partition)
        if last is not None:
            start_given = from_offset is not None or from_time is not None
            _write(renderer, _last(consumer, topic, ends, selection, renderer, last, seek=not start_given))
        elif not follow:
            _write(renderer, _selected(_to_end(consumer, topic, ends, partition), selection, renderer))
        if follow:
            _write(renderer, _selected(_forever(consumer), selection, renderer))
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
        bus.close()


def _write(renderer: RecordRenderer, entries: Iterator[Entry] | list[Entry]) -> None:
    for entry in entries:
        sys.stdout.write(json.dumps(renderer.line(entry), default=str) + "\n")
        sys.stdout.flush()


def _selected(records: Iterator[Record], selection: Selection, renderer: RecordRenderer) -> Iterator[Entry]:
    for record in records:
        entry = Entry.of(record, renderer.codec)
        if selection.matches(entry, renderer):
            yield entry


def _last(
    consumer: Consumer,
    topic: str,
    ends: dict[int, int],
    selection: Selection,
    renderer: RecordRenderer,
    count: int,
    *,
    seek: bool,
) -> list[Entry]:
    """The newest ``count`` selected records, oldest first.

    Without a field filter or a start position, each partition is read from ``count`` records before its end; on
    Kafka, transaction markers take offsets too, so the window widens until it holds ``count`` or the whole topic.
    """
    window = count
    while True:
        narrowed = seek and not selection.by_field
        if narrowed:
            for p, end in ends.items():
                consumer.seek(TopicPartition(topic, p), max(0, end - window))
        records = _to_end(consumer, topic, ends, selection.partition)
        newest = heapq.nlargest(count, _selected(records, selection, renderer), key=lambda e: e.sort_key)
        if not narrowed or len(newest) >= count or all(end <= window for end in ends.values()):
            return sorted(newest, key=lambda e: e.sort_key)
        window *= 4


def _to_end(consumer: Consumer, topic: str, ends: dict[int, int], partition: int | None) -> Iterator[Record]:
    """Records until the consumer reached the end offsets seen at the start (of ``partition``, else of all)."""
    until = {TopicPartition(topic, p): end for p, end in ends.items() if end > 0 and partition in (None, p)}
    # Transaction markers take offsets no record has, so positions may stop short of the end offsets:
    # two empty polls in a row also mean the end.
    return read_until_quiet(
        consumer, max_records=POLL_RECORDS, poll_timeout_s=0.5, idle_polls=IDLE_POLLS_AT_END, until=until
    )


def _forever(consumer: Consumer) -> Iterator[Record]:
    while True:
        yield from consumer.poll(max_records=POLL_RECORDS, timeout_s=0.5)


def _position(
    consumer: Consumer,
    topic: str,
    ends: dict[int, int],
    from_offset: int | None,
    from_time: str | None,
    partition: int | None,
) -> None:
    if from_time is not None:
        consumer.seek_to_timestamp(parse_time(from_time))
    elif from_offset is not None:
        for p in ends:
            if partition is None or p == partition:
                consumer.seek(TopicPartition(topic, p), from_offset)
