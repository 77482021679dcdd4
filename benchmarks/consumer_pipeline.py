"""Stream-consumer throughput: the trajectory assembler beside a plain consume-and-produce loop, same records, same run.

A realistic mix: episodes of 30 model calls (a growing agent context: first prompt 2,000 tokens, +250 completion and
+400 tool-output tokens per call, prefix-delta encoded by the EpisodeRecorder exactly as the proxy publishes them),
interleaved in waves of 20 concurrent episodes. Per backend it prints episodes/s and ModelCall records/s of

- a plain loop moving the same records from the input topics to another topic (raw confluent-kafka on Kafka:
  consume + produce, no decode, no transaction; the embedded bus's own consumer + producer on the embedded log);
- the assembler under the consumer runtime (decode, join, state changelog, one transaction per poll, emit one
  Trajectory per episode);
- the assembler, then the sample builder over its trajectories, when ``consumers.samples.SampleBuilder`` exists;

then the memory the assembler holds per open episode. Starts its own single-node Kafka (infra/local/services.py)
unless ORCHARD_KAFKA_BOOTSTRAP is set.

With ``--episodes-per-s R`` it offers a steady load instead: episodes (every call, then the outcome) arrive at R per
second for ``--duration-s`` while one stage runs live on them; the offered rate doubles until a stage falls behind.
A stage sustains a rate when its lag (records published but not yet read) at the end of the offer is at most 2 s of
input; the table gives each rate's lag and output rate, per stage (the assembler on episodes; the sample builder on
the assembler's trajectories, offered at the same rate), per backend, and the highest rate each sustained.

    python benchmarks/consumer_pipeline.py [--episodes 200] [--skip-kafka]
    python benchmarks/consumer_pipeline.py --episodes-per-s 10 [--duration-s 15] [--max-rate 640] [--skip-kafka]
    python benchmarks/consumer_pipeline.py --instances 1,2,4 [--episodes 400] [--partitions 8] [--skip-kafka]

With ``--instances`` it measures scale-out instead: the sample builder as 1, 2, 4... processes of one consumer group
(``orchard consumer run sample-builder``), over the same assembled trajectories on a topic of ``--partitions``
partitions. Every instance has joined and holds its partitions; they are paused (SIGSTOP) while the input is
written, then resumed, and the time is from the resume to the group's committed offsets reaching the end of the
input (the pause is shorter than a session, so no member loses its partitions). It prints episodes/s and
the speed-up over one instance.
"""
# ruff: noqa: E402  (the script's own folder leaves sys.path before the `consumers` package is imported)

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path; keep it from shadowing installed packages.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import os
import tempfile
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable

import numpy as np
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import Producer as RawProducer
from confluent_kafka import TopicPartition as RawTopicPartition
from rich.console import Console
from rich.table import Table

from consumers.assembler import TrajectoryAssembler
from consumers.config import RuntimeConfig
from consumers.processor import Processor
from consumers.runtime import ConsumerRuntime, DriverCore, RuntimeStats, read_topic
from consumers.state import ChangelogStateStore
from consumers.synthetic import CapturedRecord, SyntheticEpisode, synthetic_episode
from orchard.bus import Bus, Record, open_bus
from orchard.config import BusConfig, EmbeddedBusConfig, KafkaBusConfig
from orchard.logging import configure_logging

# Its sibling modules, which it reaches only now: the folder leaves sys.path again, because a test that loads this
# file by path must not find benchmarks/datasets.py where Hugging Face `datasets` is.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from kafka_broker import start_kafka
from sample_builder_group import scale_out

sys.path.remove(str(Path(__file__).resolve().parent))

CALLS, WAVE = 30, 20
console = Console(width=150)


def make_episodes(count: int) -> list[SyntheticEpisode]:
    """``count`` synthetic 30-call episodes."""
    return make_episodes_from(0, count)


def interleave(episodes: list[SyntheticEpisode]) -> list[CapturedRecord]:
    """Waves of ``WAVE`` concurrent episodes, records shuffled within a wave."""
    rng = np.random.default_rng(0)
    out: list[CapturedRecord] = []
    for start in range(0, len(episodes), WAVE):
        wave = [r for e in episodes[start : start + WAVE] for r in e.records]
        out += [wave[i] for i in rng.permutation(len(wave))]
    return out


def publish(bus: Bus, namespace: str, records: list[CapturedRecord]) -> None:
    """The records onto ``<namespace>.model-calls`` / ``.outcomes`` (4 partitions each)."""
    for topic in ("model-calls", "outcomes"):
        bus.create_topic(f"{namespace}.{topic}", 4, exist_ok=True)
    producer = bus.producer()
    for record in records:
        producer.produce(f"{namespace}.{record.topic}", record.value, record.key)
    producer.flush(120)
    producer.close()


def run_timed(
    bus: Bus,
    processor: Processor,
    namespace: str,
    done: Callable[[RuntimeStats], bool],
    config: RuntimeConfig,
    limit_s: float = 120,
) -> float:
    """Seconds from the runtime's first input record until ``done(stats)``."""
    runtime = ConsumerRuntime(bus, processor, namespace=namespace, instance_id="bench", config=config)
    thread = threading.Thread(target=runtime.run, daemon=True)
    thread.start()
    started = None
    deadline = time.monotonic() + limit_s
    try:
        while not done(runtime.stats):
            if started is None and runtime.stats.records_in:
                started = time.perf_counter()
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError(f"{processor.name}: not done after {limit_s:g}s ({runtime.stats})")
            time.sleep(0.002)
        return time.perf_counter() - (started or time.perf_counter())
    finally:
        runtime.stop()
        thread.join(30)


def raw_kafka_loop(bootstrap: str, namespace: str, total: int) -> float:
    """Plain confluent-kafka: consume every input record and produce it to another topic (seconds)."""
    producer = RawProducer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                            "linger.ms": 5, "message.max.bytes": 2_000_000})  # fmt: skip
    consumer = RawConsumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{uuid.uuid4().hex}",
                            "enable.auto.commit": False})  # fmt: skip
    consumer.assign(
        [RawTopicPartition(f"{namespace}.{t}", p, 0) for t in ("model-calls", "outcomes") for p in range(4)]
    )
    moved, started = 0, None
    while moved < total:
        for message in consumer.consume(num_messages=min(500, total - moved), timeout=5):
            if message.error() is not None:
                continue
            started = started or time.perf_counter()
            while True:
                try:
                    producer.produce(f"{namespace}.raw-copy", message.value(), key=message.key())
                    break
                except BufferError:
                    producer.poll(0.05)
            moved += 1
        producer.poll(0)
    producer.flush(60)
    consumer.close()
    return time.perf_counter() - (started or time.perf_counter())


def raw_embedded_loop(bus: Bus, namespace: str, total: int) -> float:
    """The embedded bus's plain consumer + producer moving every input record to another topic (seconds)."""
    consumer = bus.consumer([f"{namespace}.model-calls", f"{namespace}.outcomes"])
    producer = bus.producer()
    moved, started = 0, time.perf_counter()
    while moved < total:
        batch = consumer.poll(500, 1.0)
        for record in batch:
            producer.produce(f"{namespace}.raw-copy", record.value, record.key)
        producer.flush()
        moved += len(batch)
    consumer.close()
    return time.perf_counter() - started


def sample_builder() -> Processor | None:
    """c2's sample builder, if it is there."""
    try:
        from consumers.builtin import build_processor

        return build_processor("sample-builder")
    except Exception:  # noqa: BLE001 - absent or not ready: measured without it
        return None


def measure(label: str, bus: Bus, episodes: list[SyntheticEpisode], raw: Callable[[str, int], float]) -> list[tuple]:
    """Rows (path, seconds) for one backend."""
    records = interleave(episodes)
    rows = []
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    publish(bus, namespace, records)
    bus.create_topic(f"{namespace}.raw-copy", 4, exist_ok=True)
    rows.append((f"{label}: plain consume + produce loop", raw(namespace, len(records))))
    config = RuntimeConfig(max_poll_records=500, poll_timeout_s=0.2, progress_interval_s=3600)
    episodes_out = len(episodes)
    # done once the last input's transaction committed: its outputs are then readable
    seconds = run_timed(bus, TrajectoryAssembler(), namespace, lambda s: s.committed_in >= len(records), config)
    rows.append((f"{label}: assembler (runtime, exactly-once)", seconds))
    builder = sample_builder()
    if builder is not None:
        try:
            seconds = run_timed(bus, builder, namespace, lambda s: s.committed_in >= episodes_out, config, limit_s=60)
            rows.append((f"{label}: sample builder over the trajectories", seconds))
            rows.append((f"{label}: assembler -> sample builder (sum)", rows[-2][1] + seconds))
        except RuntimeError as exc:
            console.print(f"[yellow]sample builder not measured:[/] {exc}")
    return rows


class EpisodePool:
    """Synthetic episodes made on demand (about 45 ms each) and reused by every rate: each rate has its namespace."""

    def __init__(self) -> None:
        self.episodes: list[SyntheticEpisode] = []

    def take(self, count: int) -> list[SyntheticEpisode]:
        if count > len(self.episodes):
            self.episodes += make_episodes_from(len(self.episodes), count)
        return self.episodes[:count]


def make_episodes_from(first: int, end: int) -> list[SyntheticEpisode]:
    """Episodes ``first..end-1``: rollout groups of 8 on a task of their own, rewards mixed within each group."""
    # fmt: off
    return [
        synthetic_episode(
            f"bench-{i}", calls=CALLS, seed=i, first_prompt_tokens=2000, completion_tokens=250, tool_output_tokens=400,
            task_id=f"bench-task-{i // 8}", group_id=f"bench-group-{i // 8}", reward=float(i % 2),
        )
        for i in range(first, end)
    ]
    # fmt: on


class LiveStage:
    """One stage's runtime on a thread, reading ``namespace``'s topics as they are written."""

    def __init__(self, bus: Bus, processor: Processor, namespace: str) -> None:
        config = RuntimeConfig(max_poll_records=500, poll_timeout_s=0.2, progress_interval_s=3600)
        self.runtime = ConsumerRuntime(bus, processor, namespace=namespace, instance_id="live", config=config)
        self.thread = threading.Thread(target=self.runtime.run, daemon=True)

    def __enter__(self) -> LiveStage:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.runtime.stats.restores:  # restored at its first assignment: it is reading
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"{self.runtime.processor.name}: no partitions assigned within 60 s")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.runtime.stop()
        self.thread.join(30)


def offer(bus: Bus, stage: LiveStage, batches: list[list[tuple[str, bytes, bytes | None]]], rate: float) -> dict:
    """Publish ``batches`` (one per episode) at ``rate`` per second while ``stage`` reads; its lag over time."""
    producer = bus.producer()
    published, lags = 0, []
    started = time.perf_counter()
    next_sample = next_flush = started
    for i, batch in enumerate(batches):
        due = started + i / rate
        while (now := time.perf_counter()) < due:
            if now >= next_sample:
                lags.append(published - stage.runtime.stats.records_in)
                next_sample = now + 0.5
            time.sleep(min(0.002, due - now))
        for topic, value, key in batch:
            producer.produce(topic, value, key)
        published += len(batch)
        if time.perf_counter() >= next_flush:  # the embedded log shows records only once flushed: every 50 ms
            producer.flush(120)
            next_flush = time.perf_counter() + 0.05
    producer.flush(120)
    offered_s = time.perf_counter() - started
    final_lag = published - stage.runtime.stats.records_in
    outputs_at_end = stage.runtime.stats.outputs
    drain_deadline = time.perf_counter() + 30
    while stage.runtime.stats.records_in < published and time.perf_counter() < drain_deadline:
        time.sleep(0.01)
    producer.close()
    return {"offered_rate": len(batches) / offered_s, "final_lag": final_lag, "max_lag": max(lags, default=0),
            "records_per_episode": published / len(batches), "outputs_per_s": outputs_at_end / offered_s,
            "drained_s": time.perf_counter() - started - offered_s}  # fmt: skip


def trajectories_of(bus: Bus, episodes: list[SyntheticEpisode]) -> list[tuple[bytes, bytes | None]]:
    """The assembler's trajectory records for ``episodes`` (value, key), made once in a scratch namespace."""
    namespace = f"prep-{uuid.uuid4().hex[:6]}"
    publish(bus, namespace, interleave(episodes))
    config = RuntimeConfig(max_poll_records=500, poll_timeout_s=0.2, progress_interval_s=3600)
    run_timed(bus, TrajectoryAssembler(), namespace, lambda s: s.outputs >= len(episodes), config, limit_s=600)
    return [(r.value, r.key) for r in read_topic(bus, f"{namespace}.trajectories")]


def sustained(label: str, bus: Bus, pool: EpisodePool, first_rate: float, max_rate: float, duration_s: float) -> list:
    """Rows (backend, stage, rate, measures) for doubling offered rates until each stage falls behind."""
    rows = []
    stages: list[tuple[str, Callable[[], Processor | None]]] = [("assembler", TrajectoryAssembler),
                                                                ("sample builder", sample_builder)]  # fmt: skip
    for stage_name, make in stages:
        rate = first_rate
        while rate <= max_rate:
            processor = make()
            if processor is None:
                break
            episodes = pool.take(max(1, round(rate * duration_s)))
            namespace = f"live-{uuid.uuid4().hex[:6]}"
            for topic in ("model-calls", "outcomes", "trajectories", "scores"):
                bus.create_topic(f"{namespace}.{topic}", 4, exist_ok=True)
            if stage_name == "assembler":
                batches = [[(f"{namespace}.{r.topic}", r.value, r.key) for r in e.records] for e in episodes]
            else:
                batches = [[(f"{namespace}.trajectories", v, k)] for v, k in trajectories_of(bus, episodes)]
            console.print(f"[dim]{label} {stage_name}: offering {rate:g} episodes/s for {duration_s:g} s[/]")
            with LiveStage(bus, processor, namespace) as stage:
                result = offer(bus, stage, batches, rate)
            bound = 2 * rate * result["records_per_episode"]
            result["sustained"] = result["final_lag"] <= bound
            rows.append((label, stage_name, rate, result))
            if not result["sustained"]:
                break
            rate *= 2
    return rows


def print_sustained(rows: list) -> None:
    table = Table(title="Sustained load: lag at the end of the offer, in records (bound: 2 s of input)")
    for column in ("backend", "stage", "offered episodes/s", "achieved", "outputs/s", "max lag", "final lag",
                   "drained in s", "sustained"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("backend", "stage") else "right")
    best: dict[tuple[str, str], float] = {}
    for label, stage, rate, r in rows:
        table.add_row(label, stage, f"{rate:g}", f"{r['offered_rate']:.1f}", f"{r['outputs_per_s']:.1f}",
                      f"{r['max_lag']:,}", f"{r['final_lag']:,}", f"{r['drained_s']:.1f}",
                      "yes" if r["sustained"] else "NO")  # fmt: skip
        if r["sustained"]:
            best[(label, stage)] = max(best.get((label, stage), 0.0), rate)
        else:
            best.setdefault((label, stage), 0.0)
    console.print(table)
    for (label, stage), rate in best.items():
        console.print(f"highest sustained rate, {label} {stage}: {rate:g} episodes/s")


def memory_per_open_episode(episodes: list[SyntheticEpisode]) -> tuple[float, float, float]:
    """(Python heap bytes per open episode, state bytes per episode, encoded bytes of its records)."""
    assembler, state = TrajectoryAssembler(), ChangelogStateStore(4)
    driver = DriverCore(assembler, state, group="memory")
    assembler.open(state)
    calls = [(e, c) for e in episodes for c in e.calls]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for offset, (_, call) in enumerate(calls):
        driver.handle(Record("model-calls", 0, offset, 1_000, call.key, call.value))
        state.commit()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    raw = sum(len(c.value) for _, c in calls) / len(episodes)
    return held / len(episodes), state.committed_bytes / len(episodes), raw


def main() -> None:
    """Run every measurement and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--skip-kafka", action="store_true")
    parser.add_argument("--episodes-per-s", type=float, help="Offer a steady load, from this rate up (doubling).")
    parser.add_argument("--duration-s", type=float, default=15.0, help="How long each rate is offered.")
    parser.add_argument("--max-rate", type=float, default=640.0, help="The highest rate offered.")
    parser.add_argument("--instances", help="Scale-out: comma-separated sample-builder instance counts, e.g. 1,2,4.")
    parser.add_argument("--partitions", type=int, default=8, help="Scale-out: partitions of the trajectories topic.")
    args = parser.parse_args()
    configure_logging("console", "WARNING")
    if args.instances is not None:
        try:
            counts = [int(n) for n in args.instances.split(",")]
        except ValueError:
            parser.error(f"--instances is a comma-separated list of integers, not {args.instances!r}")
        if not counts or min(counts) < 1 or args.partitions < max(counts):
            parser.error("--instances must be >= 1 each and at most --partitions")
        main_scaling(args, counts)
        return
    if args.episodes_per_s is not None:
        if args.episodes_per_s <= 0 or args.duration_s <= 0:
            parser.error("--episodes-per-s and --duration-s must be > 0")
        main_sustained(args)
        return
    episodes = make_episodes(args.episodes)
    calls = args.episodes * CALLS
    episode_bytes = sum(len(r.value) for e in episodes for r in e.records) / len(episodes)

    rows: list[tuple] = []
    if not args.skip_kafka:
        bootstrap, stop = start_kafka()
        try:
            config: BusConfig = KafkaBusConfig(bootstrap_servers=bootstrap, max_record_bytes=4_000_000)
            bus = open_bus(config)
            rows += measure("kafka", bus, episodes, lambda ns, n: raw_kafka_loop(bootstrap, ns, n))
            bus.close()
        finally:
            stop()
    with tempfile.TemporaryDirectory() as directory:
        bus = open_bus(EmbeddedBusConfig(path=Path(directory)))
        rows += measure("embedded", bus, episodes, lambda ns, n: raw_embedded_loop(bus, ns, n))

    table = Table(
        title=f"{args.episodes} episodes x {CALLS} calls ({episode_bytes / 1024:.0f} KiB per episode on the bus)"
    )
    for column in ("path", "seconds", "episodes/s", "ModelCall records/s", "vs plain loop"):
        table.add_column(column, justify="right" if column != "path" else "left")
    baseline = 0.0
    for label, seconds in rows:
        if "plain" in label:
            baseline = seconds
        ratio = baseline / seconds if seconds else float("nan")
        table.add_row(
            label, f"{seconds:.2f}", f"{args.episodes / seconds:,.0f}", f"{calls / seconds:,.0f}", f"{ratio:.2f}x"
        )
    console.print(table)
    if sample_builder() is None:
        console.print("sample builder: not available (consumers.samples.SampleBuilder absent); assembler only")

    heap, state, raw = memory_per_open_episode(episodes[: min(50, len(episodes))])
    memory = Table(title="Assembler memory per open episode (all 30 calls in, no outcome yet)")
    memory.add_column("measure")
    memory.add_column("bytes", justify="right")
    memory.add_row("Python heap held (tracemalloc)", f"{heap:,.0f}")
    memory.add_row("of which state values (the encoded calls, as read)", f"{state:,.0f}")
    memory.add_row("the episode's ModelCall records on the bus", f"{raw:,.0f}")
    console.print(memory)


def main_sustained(args: argparse.Namespace) -> None:
    """Doubling steady loads per stage and backend; the table of lags and the highest sustained rates."""
    pool, rows = EpisodePool(), []
    if not args.skip_kafka:
        bootstrap, stop = start_kafka()
        try:
            bus = open_bus(KafkaBusConfig(bootstrap_servers=bootstrap, max_record_bytes=4_000_000))
            rows += sustained("kafka", bus, pool, args.episodes_per_s, args.max_rate, args.duration_s)
            bus.close()
        finally:
            stop()
    with tempfile.TemporaryDirectory() as directory:
        bus = open_bus(EmbeddedBusConfig(path=Path(directory)))
        rows += sustained("embedded", bus, pool, args.episodes_per_s, args.max_rate, args.duration_s)
    print_sustained(rows)


def main_scaling(args: argparse.Namespace, counts: list[int]) -> None:
    """The sample builder as 1, 2, 4... instances per backend; the table of episodes/s and speed-ups."""
    episodes = make_episodes(args.episodes)
    rows: list[tuple[str, int, float]] = []
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        configs: list[tuple[str, BusConfig, Callable[[], None]]] = []
        if not args.skip_kafka:
            bootstrap, stop = start_kafka()
            configs.append(("kafka", KafkaBusConfig(bootstrap_servers=bootstrap, max_record_bytes=4_000_000), stop))
        configs.append(("embedded", EmbeddedBusConfig(path=work / "bus"), lambda: None))
        for label, config, stop in configs:
            try:
                bus = open_bus(config)
                trajectories = trajectories_of(bus, episodes)
                for count in counts:
                    console.print(f"[dim]{label}: {count} sample-builder instance(s)[/]")
                    rows.append((label, count, scale_out(label, bus, config, trajectories, count, args.partitions,
                                                         work)))  # fmt: skip
                bus.close()
            finally:
                stop()
    table = Table(title=f"Sample builder scale-out: {args.episodes} episodes x {CALLS} calls, "
                        f"{args.partitions} partitions, {os.cpu_count()} cores")  # fmt: skip
    for column in ("backend", "instances", "seconds", "episodes/s", "vs 1 instance"):
        table.add_column(column, justify="left" if column == "backend" else "right")
    single = {label: seconds for label, count, seconds in rows if count == min(counts)}
    for label, count, seconds in rows:
        table.add_row(label, str(count), f"{seconds:.2f}", f"{args.episodes / seconds:,.1f}",
                      f"{single[label] / seconds:.2f}x")  # fmt: skip
    console.print(table)


if __name__ == "__main__":
    main()
