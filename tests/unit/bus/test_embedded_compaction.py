"""Compaction of the embedded log's compacted topics: latest value per key, offsets kept, readers, crashes."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from consumers.runtime import read_topic
from consumers.state import ChangelogStateStore
from orchard.bus import Record, TopicPartition
from orchard.bus.embedded import EmbeddedBus
from orchard.bus.embedded.log import PartitionLog
from orchard.config import EmbeddedBusConfig

COMPACT = {"cleanup.policy": "compact"}
DAY_MS = 24 * 3600 * 1000
Row = tuple[int, bytes | None, bytes]  # offset, key, value

CRASHING_COMPACTOR = """
import os, signal, sys
from orchard.bus.embedded import EmbeddedBus
from orchard.bus.embedded import segments
from orchard.config import EmbeddedBusConfig

point = sys.argv[2]
real_replace, real_unlink, real_add = os.replace, os.unlink, segments.CompactedWriter.add
renamed = []

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def add(self, record, running_ts):
    if point == "mid-copy" and self.count == 5:
        die()
    real_add(self, record, running_ts)

def replace(src, dst):
    if point == "before-rename" and str(dst).endswith(".cseg"):
        die()
    real_replace(src, dst)
    if str(dst).endswith(".cseg"):
        renamed.append(dst)
        if point == "after-rename":
            die()

def unlink(path, *args, **kwargs):
    if point == "mid-delete" and renamed and str(path).endswith(".log"):
        die()  # the first source's index is gone; its frames and every later source are still there
    real_unlink(path, *args, **kwargs)

segments.CompactedWriter.add, os.replace, os.unlink = add, replace, unlink
EmbeddedBus(EmbeddedBusConfig(path=sys.argv[1], segment_bytes=4096)).compact("t")
print("compacted without being killed", flush=True)
"""


def make_bus(path: Path, topic_config: dict[str, str] | None = None) -> EmbeddedBus:
    """A bus with small segments and a one-partition topic ``t`` (compacted unless told otherwise)."""
    bus = EmbeddedBus(EmbeddedBusConfig(path=path, segment_bytes=4096))
    bus.create_topic("t", partitions=1, config=COMPACT if topic_config is None else topic_config, exist_ok=True)
    return bus


def updates(count: int, keys: int = 10, seed: int = 0) -> list[tuple[bytes | None, bytes]]:
    """``count`` updates of ``keys`` keys, values naming their key and step; every 50th record has no key."""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not a secret
    rows: list[tuple[bytes | None, bytes]] = []
    for step in range(count):
        key = None if step % 50 == 49 else f"k{rng.randrange(keys)}".encode()
        rows.append((key, f"{key!r}@{step}|".encode() * 8))
    return rows


def write(bus: EmbeddedBus, rows: Iterable[tuple[bytes | None, bytes]], timestamp_ms: int | None = None) -> list[Row]:
    """Append each (key, value) to partition 0 of ``t``, one append each (segments roll as they fill); return
    the rows with the offsets they got."""
    producer = bus.producer()
    out: list[Row] = []
    for key, value in rows:
        producer.produce("t", value, key, partition=0, timestamp_ms=timestamp_ms,
                         on_delivery=lambda d, k=key, v=value: out.append((d.offset, k, v)))  # fmt: skip
        producer.flush()
    return out


def read_all(bus: EmbeddedBus, start: int | None = None) -> list[Row]:
    """Every record of partition 0 of ``t`` (from ``start``) in the order a fresh consumer returns them."""
    reader = bus.consumer(["t"])
    if start is not None:
        reader.seek(TopicPartition("t", 0), start)
    rows: list[Row] = []
    while batch := reader.poll(max_records=100, timeout_s=0.05):
        rows.extend((r.offset, r.key, r.value) for r in batch)
    reader.close()
    return rows


def partition_dir(path: Path) -> Path:
    """Partition 0 of ``t``."""
    return path / "topics" / "t" / "0"


def active_base(path: Path) -> int:
    """Base offset of the newest segment of partition 0."""
    return max(int(p.stem) for p in partition_dir(path).glob("*.idx"))


def compacted(rows: list[Row], below: int, *, drop_tombstones: bool = False) -> list[Row]:
    """What compacting everything below ``below`` keeps: the latest record of each key there, keyless records,
    and everything from ``below`` on (with ``drop_tombstones``, without the empty values below ``below``)."""
    latest = {key: offset for offset, key, _ in rows if offset < below and key is not None}
    return [(o, k, v) for o, k, v in rows if o >= below or k is None or (latest[k] == o and (v or not drop_tombstones))]


def latest_values(rows: Iterable[Row]) -> dict[bytes, bytes]:
    """The last value of each key (a key whose last value is empty is absent), reading ``rows`` in order."""
    out: dict[bytes, bytes] = {}
    for _, key, value in rows:
        if key is not None:
            out[key] = value
    return {key: value for key, value in out.items() if value}


@pytest.fixture
def no_auto_compaction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers in this process never compact by themselves, so the test decides when compaction happens."""
    monkeypatch.setattr(PartitionLog, "after_append", lambda self: None)


def test_compaction_keeps_the_latest_value_per_key_at_its_original_offset(tmp_path: Path) -> None:
    bus = make_bus(tmp_path)
    written = write(bus, updates(600))
    assert [offset for offset, _, _ in written] == list(range(600))

    bus.compact("t")
    below = active_base(tmp_path)
    assert below > 400  # most of the log was closed and so compactable
    rows = read_all(bus)
    assert rows == compacted(written, below)
    assert len(rows) < 200
    assert bus.describe_topic("t").start_offsets == {0: 0}
    assert bus.describe_topic("t").end_offsets == {0: 600}
    assert sorted(p.name for p in partition_dir(tmp_path).iterdir() if p.suffix != ".lock") == [
        f"{0:020d}.cseg", f"{below:020d}.idx", f"{below:020d}.log", "lock",
    ]  # fmt: skip
    assert bus.producer().send("t", b"after", b"k1", partition=0).offset == 600


def test_compaction_runs_by_itself_as_segments_roll_and_only_on_compacted_topics(tmp_path: Path) -> None:
    bus = make_bus(tmp_path)
    bus.create_topic("plain", partitions=1)
    producer = bus.producer()
    for key, value in updates(600):
        for topic in ("t", "plain"):
            producer.produce(topic, value, key, partition=0)
        producer.flush()
    assert list(partition_dir(tmp_path).glob("*.cseg"))
    assert len(read_all(bus)) < 300
    assert not list((tmp_path / "topics" / "plain" / "0").glob("*.cseg"))
    assert bus.describe_topic("plain").record_count == 600
    assert bus.compact("plain") == 0


def test_tombstones_delete_their_key_and_go_after_delete_retention(tmp_path: Path, no_auto_compaction: None) -> None:
    bus = make_bus(tmp_path)
    now = 1_700_000_000_000
    written = write(bus, [(b"gone", b"v1"), (b"kept", b"v2"), (b"gone", b"")], timestamp_ms=now)
    written += write(bus, updates(100, keys=3), timestamp_ms=now)  # fills segments past the tombstone
    below = active_base(tmp_path)

    assert bus.compact("t", now_ms=now + 1000) > 0
    assert read_all(bus) == compacted(written, below)
    assert (2, b"gone", b"") in read_all(bus)  # a reader following the topic still sees the delete

    assert bus.compact("t", now_ms=now + DAY_MS + 1) == 1
    assert read_all(bus) == compacted(written, below, drop_tombstones=True)
    assert b"gone" not in {key for _, key, _ in read_all(bus)}
    assert latest_values(read_all(bus)) == latest_values(written)


def test_a_reader_inside_a_compacted_range_continues_at_the_next_record(
    tmp_path: Path, no_auto_compaction: None
) -> None:
    bus = make_bus(tmp_path)
    written = write(bus, updates(400))
    reader_bus = EmbeddedBus(EmbeddedBusConfig(path=tmp_path, segment_bytes=4096))  # its own cache, as another process
    reader = reader_bus.consumer(["t"])
    first = reader.poll(max_records=37, timeout_s=0.1)
    assert [r.offset for r in first] == list(range(37))

    bus.compact("t")
    survivors = compacted(written, active_base(tmp_path))
    rest: list[Record] = []
    while batch := reader.poll(max_records=25, timeout_s=0.05):
        rest.extend(batch)
    assert [(r.offset, r.key, r.value) for r in rest] == [row for row in survivors if row[0] >= 37]

    gap = next(offset for offset in range(1, 400) if offset not in {row[0] for row in survivors})
    assert read_all(reader_bus, start=gap)[0] == next(row for row in survivors if row[0] > gap)
    assert read_all(reader_bus) == survivors


def test_state_restored_from_a_compacted_changelog_equals_the_uncompacted_one_and_reads_far_fewer_records(
    tmp_path: Path,
) -> None:
    bus = EmbeddedBus(EmbeddedBusConfig(path=tmp_path, segment_bytes=4096))
    bus.create_topic("g.changelog", partitions=2, config=COMPACT)
    bus.create_topic("plain.changelog", partitions=2)
    state, rng = ChangelogStateStore(2), random.Random(3)  # noqa: S311 - reproducible test data
    producer = bus.transactional_producer("g.instance")
    for step in range(400):  # 400 transactions of 8 changes each, as the consumer runtime commits them
        for _ in range(8):
            state.begin_record(rng.randrange(2))
            key = f"episode-{rng.randrange(40)}"
            if rng.random() < 0.1:
                state.delete(key)
            else:
                state.put(key, f"{key} at step {step} ".encode() * 4)
            state.end_record()
        producer.begin()
        for change in state.changelog():
            for topic in ("g.changelog", "plain.changelog"):
                producer.produce(topic, change.value, change.key, partition=change.partition)
        producer.commit()
        state.commit()
    expected = dict(state.items())

    restored_compacted, read_compacted = restore(bus, "g.changelog")
    restored_plain, read_plain = restore(bus, "plain.changelog")
    assert restored_compacted == restored_plain == expected
    assert read_plain > 3000
    assert read_compacted * 5 < read_plain


def restore(bus: EmbeddedBus, topic: str) -> tuple[dict[str, bytes], int]:
    """A fresh state restored from ``topic`` as the consumer runtime does it, and how many records it read."""
    seen = [0]

    def counted(records: Iterator[Record]) -> Iterator[Record]:
        for record in records:
            seen[0] += 1
            yield record

    state = ChangelogStateStore(2)
    state.restore(counted(read_topic(bus, topic, poll_timeout_s=0.05)))
    return dict(state.items()), seen[0]


def test_compaction_keeps_the_records_of_a_transaction_not_yet_fully_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchard.bus.embedded import log as log_module

    bus = make_bus(tmp_path)
    bus.create_topic("other", partitions=1)
    txn = bus.transactional_producer("tx")
    txn.begin()
    txn.produce("t", b"from the transaction", b"k", partition=0)
    txn.produce("other", b"x", partition=0)
    real_append = log_module.PartitionLog.append_locked

    def dies_on_second_partition(self: PartitionLog, records: list[log_module.PendingRecord]) -> int:
        if self.directory.parent.name == "other":  # the process "dies" after the journal and topic t were written
            raise KeyboardInterrupt
        return real_append(self, records)

    monkeypatch.setattr(log_module.PartitionLog, "append_locked", dies_on_second_partition)
    with pytest.raises(KeyboardInterrupt):
        txn.commit()
    monkeypatch.setattr(log_module.PartitionLog, "append_locked", real_append)
    later = write(bus, [(b"k", f"later {i}".encode() * 20) for i in range(200)])  # rolls, and compacts, many times
    bus.compact("t")

    reopened = EmbeddedBus(EmbeddedBusConfig(path=tmp_path, segment_bytes=4096))  # settles the transaction
    values = [value for _, key, value in read_all(reopened) if key == b"k"]
    assert values.count(b"from the transaction") == 1  # counted by its tag, not appended a second time
    assert values[-1] == later[-1][2]
    assert reopened.compact("t") > 0  # once settled, it may go like any other superseded record
    assert [value for _, key, value in read_all(reopened) if key == b"k"][-1] == later[-1][2]


@pytest.mark.parametrize("point", ["mid-copy", "before-rename", "after-rename", "mid-delete"])
def test_a_compactor_killed_mid_compaction_leaves_a_readable_log(
    tmp_path: Path, no_auto_compaction: None, point: str
) -> None:
    bus = make_bus(tmp_path)
    written = write(bus, updates(500))
    below = active_base(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", CRASHING_COMPACTOR, str(tmp_path), point], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -9, done.stdout + done.stderr
    leftovers = {p.suffix for p in partition_dir(tmp_path).iterdir()}
    assert (".tmp" in leftovers) == (point in ("mid-copy", "before-rename"))

    after_crash = EmbeddedBus(EmbeddedBusConfig(path=tmp_path, segment_bytes=4096))
    rows = read_all(after_crash)
    offsets = [offset for offset, _, _ in rows]
    assert offsets == sorted(set(offsets))  # in order, nothing twice
    assert set(rows) <= set(written)  # only records that were written, unchanged
    assert set(compacted(written, below)) <= set(rows)  # and every record compaction keeps
    assert latest_values(rows) == latest_values(written)
    assert read_all(after_crash, start=below) == [row for row in written if row[0] >= below]

    written += write(after_crash, [(b"k0", b"new")])
    assert written[-1][0] == 500
    after_crash.compact("t")
    assert read_all(after_crash) == compacted(written, active_base(tmp_path))
    assert sorted(p.suffix for p in partition_dir(tmp_path).iterdir()) == ["", ".cseg", ".idx", ".lock", ".log"]


KEYED_WRITER = """
import sys
from orchard.bus.embedded import EmbeddedBus
from orchard.config import EmbeddedBusConfig
bus = EmbeddedBus(EmbeddedBusConfig(path=sys.argv[1], segment_bytes=4096))
producer, tag = bus.producer(), sys.argv[2]
for i in range(int(sys.argv[3])):
    producer.produce("t", f"{tag}:{i:06d}|".encode() * 10, f"{tag}-k{i % 7}".encode(), partition=0)
    producer.flush()  # one append each: every roll compacts, in whichever process rolled
print("done", flush=True)
"""


def test_processes_writing_compacting_and_reading_at_once_lose_and_reorder_nothing(tmp_path: Path) -> None:
    bus = make_bus(tmp_path)
    writers = [
        subprocess.Popen([sys.executable, "-c", KEYED_WRITER, str(tmp_path), tag, "1500"], stdout=subprocess.PIPE)
        for tag in ("a", "b")
    ]
    reader = EmbeddedBus(EmbeddedBusConfig(path=tmp_path, segment_bytes=4096)).consumer(["t"])
    seen: list[Record] = []
    while True:
        running = any(w.poll() is None for w in writers)
        batch = reader.poll(max_records=50, timeout_s=0.01)
        seen.extend(batch)
        if not (running or batch):
            break
    for writer in writers:
        assert writer.returncode == 0
    offsets = [r.offset for r in seen]
    assert offsets == sorted(set(offsets))  # a reader racing the compactors sees each offset once, in order
    for tag in ("a", "b"):
        steps = [int(r.value.split(b"|")[0].split(b":")[1]) for r in seen if r.value.startswith(tag.encode())]
        assert steps == sorted(steps)  # each writer's records in the order it wrote them
        assert steps[-1] == 1499
    final = {key: value for _, key, value in read_all(bus) if key is not None}
    assert final == {
        f"{tag}-k{k}".encode(): f"{tag}:{max(i for i in range(1500) if i % 7 == k):06d}|".encode() * 10
        for tag in ("a", "b")
        for k in range(7)
    }
    assert bus.describe_topic("t").end_offsets == {0: 3000}
    assert len(read_all(bus)) < 400
    assert list(partition_dir(tmp_path).glob("*.cseg"))
