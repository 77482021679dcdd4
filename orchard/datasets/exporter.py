"""``orchard export``: recorded episodes (any run, any range) to Parquet or JSONL in the ``orchard`` layout.

An episode is selected by its ``EpisodeOutcome`` (run, bus timestamp range, offset range of the outcomes topic) and
written with every ``ModelCall`` of it, assembled by ``orchard.trajectory.trajectory_from_records``. Episodes
without an outcome are not exported.

Memory stays bounded by working one partition of the outcomes topic at a time: its selected outcomes are read
first (small records), then the matching partition of ``model-calls`` (the same number when both topics have as
many partitions: records are keyed by episode id) is streamed, and an episode is written as soon as it and every
episode before it in outcome order have all their calls. Rows therefore come out in (partition, offset) order of
the outcomes, which importing the file reproduces: export, import, export gives the same file.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from orchard.bus import Bus, Record, TopicPartition, read_until_quiet
from orchard.codec import Codec
from orchard.datasets.exceptions import DatasetError
from orchard.datasets.orchard_format import SCHEMA, trajectory_to_row
from orchard.logging import get_logger
from orchard.serialization_errors import SerializationError
from orchard.topics import MODEL_CALLS, OUTCOMES
from orchard.trajectory import trajectory_from_records

log = get_logger("datasets.exporter")
ExportFormat = Literal["parquet", "jsonl"]
ROWS_PER_GROUP = 128
IDLE_END_S = 5.0  # a fetch from a loaded broker can take seconds; markers at a partition's end are rare here


@dataclass(frozen=True)
class ExportSelection:
    """Which episodes to export: a run (None: all), an outcome timestamp range and an offset range (per partition
    of the outcomes topic; ``to_*`` exclusive)."""

    run_id: str | None = None
    from_ts: int | None = None
    to_ts: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None

    def wants(self, record: Record, outcome: Mapping[str, Any]) -> bool:
        """Whether the outcome ``record`` (decoded as ``outcome``) is selected."""
        return (
            (self.run_id is None or outcome["run_id"] == self.run_id)
            and (self.from_ts is None or record.timestamp_ms >= self.from_ts)
            and (self.to_ts is None or record.timestamp_ms < self.to_ts)
        )


@dataclass
class ExportStats:
    """What an export wrote."""

    episodes: int = 0
    calls: int = 0
    incomplete: int = 0
    skipped: int = 0
    seconds: float = 0.0

    @property
    def rows_per_s(self) -> float:
        """Rows written per second."""
        return self.episodes / self.seconds if self.seconds else 0.0


def export_trajectories(
    bus: Bus,
    out: Path,
    fmt: ExportFormat,
    selection: ExportSelection = ExportSelection(),  # noqa: B008 - frozen, never mutated
    *,
    on_episode: Callable[[], None] | None = None,
    model_calls_topic: str = MODEL_CALLS,
    outcomes_topic: str = OUTCOMES,
    codec: Codec | None = None,
) -> ExportStats:
    """Write the selected episodes to ``out``; return what was written."""
    started, stats, codec = time.perf_counter(), ExportStats(), codec or Codec.default()
    outcomes_info, calls_info = bus.describe_topic(outcomes_topic), bus.describe_topic(model_calls_topic)
    same_partitions = outcomes_info.partitions == calls_info.partitions
    with _open_sink(out, fmt) as sink:
        for partition in sorted(outcomes_info.end_offsets):
            start = max(outcomes_info.start_offsets.get(partition, 0), selection.from_offset or 0)
            end = outcomes_info.end_offsets[partition]
            end = end if selection.to_offset is None else min(end, selection.to_offset)
            wanted = _selected_outcomes(bus, outcomes_topic, partition, start, end, selection, codec)
            call_partitions = [partition] if same_partitions else sorted(calls_info.end_offsets)
            _export_partition(bus, model_calls_topic, call_partitions, wanted, sink, stats, codec, on_episode)
    stats.seconds = time.perf_counter() - started
    return stats


def _selected_outcomes(
    bus: Bus, topic: str, partition: int, start: int, end: int, selection: ExportSelection, codec: Codec
) -> OrderedDict[str, dict[str, Any]]:
    wanted: OrderedDict[str, dict[str, Any]] = OrderedDict()
    with contextlib.closing(read_partition(bus, topic, partition, start, end)) as records:
        for record in records:
            outcome = _decode(record, codec, "EpisodeOutcome")
            if outcome is not None and selection.wants(record, outcome):
                wanted.pop(outcome["episode_id"], None)  # a re-published outcome counts where it was last written
                wanted[outcome["episode_id"]] = outcome
    return wanted


def _export_partition(
    bus: Bus,
    topic: str,
    partitions: list[int],
    wanted: OrderedDict[str, dict[str, Any]],
    sink: _Sink,
    stats: ExportStats,
    codec: Codec,
    on_episode: Callable[[], None] | None,
) -> None:
    pending: dict[str, dict[int, dict[str, Any]]] = {}

    def flush_complete() -> None:
        while wanted:
            episode_id, outcome = next(iter(wanted.items()))
            if len(pending.get(episode_id, {})) < outcome["num_model_calls"]:
                return
            wanted.popitem(last=False)
            _write(outcome, pending.pop(episode_id, {}), sink, stats, on_episode)

    info = bus.describe_topic(topic)
    for partition in partitions:
        if not wanted:
            return
        start, end = info.start_offsets.get(partition, 0), info.end_offsets[partition]
        with contextlib.closing(read_partition(bus, topic, partition, start, end)) as records:
            for record in records:
                call = _decode(record, codec, "ModelCall")
                if call is None or call["episode_id"] not in wanted:
                    continue
                if wanted[call["episode_id"]]["run_id"] != call["run_id"]:
                    continue
                pending.setdefault(call["episode_id"], {})[call["call_index"]] = call
                flush_complete()
                if not wanted:
                    break
    for episode_id, outcome in wanted.items():  # calls missing: write what was recorded
        stats.incomplete += 1
        _write(outcome, pending.pop(episode_id, {}), sink, stats, on_episode)
    wanted.clear()


def _write(
    outcome: Mapping[str, Any],
    calls: Mapping[int, Mapping[str, Any]],
    sink: _Sink,
    stats: ExportStats,
    on_episode: Callable[[], None] | None,
) -> None:
    if not calls:
        log.warning("episode has no recorded calls; not exported", episode_id=outcome["episode_id"])
        stats.skipped += 1
        return
    ordered = [calls[index] for index in sorted(calls)]
    try:
        trajectory = trajectory_from_records(ordered, outcome)
    except (SerializationError, KeyError, ValueError) as exc:
        log.warning("cannot assemble episode; not exported", episode_id=outcome["episode_id"], error=str(exc))
        stats.skipped += 1
        return
    tools = [json.loads(call["request_tools_json"]) for call in ordered]
    sink.write(trajectory_to_row(trajectory, ordered[-1]["harness"], ordered[-1]["model"], tools))
    stats.episodes += 1
    stats.calls += len(ordered)
    if on_episode is not None:
        on_episode()


def read_partition(bus: Bus, topic: str, partition: int, start: int, end: int) -> Iterator[Record]:
    """Records of one partition from ``start`` up to ``end`` (exclusive), through a consumer without a group."""
    if start >= end:
        return
    consumer = bus.consumer([topic])
    ends = bus.describe_topic(topic).end_offsets
    try:
        for other, other_end in ends.items():
            consumer.seek(TopicPartition(topic, other), start if other == partition else other_end)
        # Transaction markers take offsets no record has, so the position may stop short of the end: a
        # partition that has given nothing for IDLE_END_S is read to its end too.
        until = {TopicPartition(topic, partition): end}
        for record in read_until_quiet(consumer, max_records=500, poll_timeout_s=0.5, quiet_s=IDLE_END_S, until=until):
            if record.partition == partition and start <= record.offset < end:
                yield record
    finally:
        consumer.close()


def _decode(record: Record, codec: Codec, expected: str) -> dict[str, Any] | None:
    try:
        decoded = codec.decode(record.value)
    except SerializationError as exc:
        log.warning("undecodable record skipped", topic=record.topic, offset=record.offset, error=str(exc))
        return None
    return decoded.record if decoded.name == expected else None


class _Sink:
    """Where rows go: a Parquet or JSONL file."""

    def write(self, row: dict[str, Any]) -> None:
        """Add one row."""
        raise NotImplementedError

    def close(self) -> None:
        """Write what is buffered and close the file."""
        raise NotImplementedError


class _ParquetSink(_Sink):
    def __init__(self, path: Path) -> None:
        self.writer = pq.ParquetWriter(path, SCHEMA, compression="zstd")
        self.rows: list[dict[str, Any]] = []

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= ROWS_PER_GROUP:
            self._flush()

    def _flush(self) -> None:
        if self.rows:
            self.writer.write_table(pa.Table.from_pylist(self.rows, schema=SCHEMA))
            self.rows = []

    def close(self) -> None:
        self._flush()
        self.writer.close()


class _JsonlSink(_Sink):
    def __init__(self, path: Path) -> None:
        self.handle: IO[str] = path.open("w", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        row = {**row, "messages": [{k: v for k, v in m.items() if v is not None} for m in row["messages"]]}
        self.handle.write(json.dumps(row, default=_json_default, ensure_ascii=False) + "\n")

    def close(self) -> None:
        self.handle.close()


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


@contextlib.contextmanager
def _open_sink(path: Path, fmt: ExportFormat) -> Iterator[_Sink]:
    if fmt not in ("parquet", "jsonl"):
        raise DatasetError(f"--format {fmt!r}: choose parquet or jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    sink: _Sink = _ParquetSink(path) if fmt == "parquet" else _JsonlSink(path)
    try:
        yield sink
    finally:
        sink.close()
