"""Bus throughput and bytes on the wire, Orchard's path beside the raw client in the same run.

Prints one table of records/s and MB/s for realistic ``ModelCall`` records (4,096 prompt tokens, 512 completion
tokens with logprobs, the request and response text):

- Kafka: the raw confluent-kafka producer/consumer moving pre-encoded bytes, beside Orchard's bus producing
  freshly encoded records and consuming + decoding them (the whole path a component pays);
- embedded: a bare append-to-file loop beside Orchard's embedded bus, the same way;

then bytes per token, and bytes per 30-call episode with and without prefix delta encoding.
Starts its own single-node Kafka (infra/local/services.py) unless ORCHARD_KAFKA_BOOTSTRAP is set.

    python benchmarks/bus.py [--records 2000] [--skip-kafka]
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import Producer as RawProducer
from confluent_kafka import TopicPartition as RawTopicPartition
from rich.console import Console
from rich.table import Table

from orchard.bus import Bus, open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig, KafkaBusConfig
from orchard.prefix_delta import PrefixDeltaEncoder

# Its sibling modules; the folder leaves sys.path again, because a test that loads this file by path must not
# find benchmarks/datasets.py where Hugging Face `datasets` is.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from kafka_broker import start_kafka  # noqa: E402

sys.path.remove(str(Path(__file__).resolve().parent))

PROMPT_TOKENS, COMPLETION_TOKENS, CHARS_PER_TOKEN = 4096, 512, 4
console = Console()


def text(rng: np.random.Generator, tokens: int) -> str:
    """Filler text of about ``tokens`` tokens."""
    words = rng.integers(0, 10_000, size=tokens // 2)
    return " ".join(f"w{w}" for w in words)[: tokens * CHARS_PER_TOKEN]


def model_call(
    rng: np.random.Generator,
    call_index: int,
    prompt: np.ndarray,
    completion: np.ndarray,
    messages: list[dict[str, str]],
    *,
    base: int | None = None,
    prefix_length: int = 0,
    messages_prefix_count: int = 0,
) -> dict[str, Any]:
    """A ModelCall record; with a base, ``prompt`` and ``messages`` are only what is new since that call."""
    return {
        "run_id": "bench",
        "episode_id": "episode-1",
        "task_id": "task-1",
        "call_index": call_index,
        "harness": "builtin",
        "api_flavour": "CHAT",
        "model": "tiny",
        "policy_version": 3,
        "request_messages_json": json.dumps(messages),
        "request_messages_prefix_count": messages_prefix_count,
        "request_tools_json": "[]",
        "sampling_params_json": json.dumps({"temperature": 1.0, "max_tokens": COMPLETION_TOKENS}),
        "response_text": text(rng, len(completion)),
        "response_tool_calls_json": "[]",
        "finish_reason": "stop",
        "prompt_base_call_index": base,
        "prompt_prefix_length": prefix_length,
        "prompt_token_ids": prompt.astype(np.int32),
        "completion_token_ids": completion.astype(np.int32),
        "completion_logprobs": -rng.random(len(completion), dtype=np.float32),
        "retokenized": False,
        "latency_ms": 812.5,
        "timestamp": int(time.time() * 1000),
    }


def realistic_records(codec: Codec, count: int) -> list[bytes]:
    """``count`` distinct encoded ModelCalls of the benchmark's size."""
    rng = np.random.default_rng(0)
    messages = [{"role": "user", "content": text(rng, PROMPT_TOKENS)}]
    out = []
    for i in range(count):
        prompt = rng.integers(0, 150_000, PROMPT_TOKENS)
        completion = rng.integers(0, 150_000, COMPLETION_TOKENS)
        out.append(codec.encode("ModelCall", model_call(rng, i, prompt, completion, messages)))
    return out


def rate(count: int, size: int, seconds: float) -> tuple[float, float]:
    """(records/s, MB/s)."""
    return count / seconds, size / seconds / 1e6


def timed(fn: Callable[[], int]) -> tuple[int, float]:
    """Run ``fn`` (returning the number of bytes it moved) and time it."""
    start = time.perf_counter()
    moved = fn()
    return moved, time.perf_counter() - start


# ------------------------------------------------------------------------------------------------ kafka
def kafka_rows(bootstrap: str, values: list[bytes], codec: Codec, records: list[dict[str, Any]]) -> list[tuple]:
    """Raw producer/consumer vs Orchard's Kafka bus on the same broker."""
    bus = open_bus(KafkaBusConfig(bootstrap_servers=bootstrap, max_record_bytes=2_000_000))
    raw_topic, our_topic = f"bench-raw-{uuid.uuid4().hex[:6]}", f"bench-orchard-{uuid.uuid4().hex[:6]}"
    bus.create_topic(raw_topic, partitions=4)
    bus.create_topic(our_topic, partitions=4)
    conf = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "partitioner": "murmur2_random",
        "message.max.bytes": 2_000_000 + 65_536,
    }
    total = sum(len(v) for v in values)
    n = len(values)

    raw_producer, our_producer = RawProducer(conf), bus.producer()
    for warm in (raw_producer, our_producer):  # connections and metadata before the clock starts
        warm.produce(raw_topic if warm is raw_producer else our_topic, b"warm-up")
        warm.flush()

    def raw_produce() -> int:
        for i, value in enumerate(values):
            while True:
                try:
                    raw_producer.produce(raw_topic, value, key=b"e%d" % (i % 64))
                    break
                except BufferError:
                    raw_producer.poll(0.05)
            raw_producer.poll(0)
        raw_producer.flush(60)
        return total

    def orchard_produce_bytes() -> int:
        for i, value in enumerate(values):
            our_producer.produce(our_topic, value, key=b"e%d" % (i % 64))
        our_producer.flush(60)
        return total

    def orchard_produce() -> int:
        moved = 0
        for i, record in enumerate(records):
            value = codec.encode("ModelCall", record)
            moved += len(value)
            our_producer.produce(our_topic, value, key=b"e%d" % (i % 64))
        our_producer.flush(60)
        return moved

    def raw_consume() -> int:
        consumer = RawConsumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{uuid.uuid4().hex}"})
        consumer.assign([RawTopicPartition(raw_topic, p, 0) for p in range(4)])
        got = moved = 0
        while got < n + 1:
            for msg in consumer.consume(num_messages=min(500, n + 1 - got), timeout=5):
                if msg.error() is None:
                    got += 1
                    moved += len(msg.value())
        consumer.close()
        return moved

    def orchard_consume(decode: bool) -> Callable[[], int]:
        def run() -> int:
            consumer = bus.consumer([our_topic])
            got = moved = 0
            while got < 2 * n + 1:
                for record in consumer.poll(max_records=min(500, 2 * n + 1 - got), timeout_s=5):
                    if decode and record.value != b"warm-up":
                        codec.decode(record.value)
                    got += 1
                    moved += len(record.value)
            consumer.close()
            return moved // 2

        return run

    rows = []
    for label, fn, factor in (
        ("kafka produce, raw confluent-kafka (encoded bytes)", raw_produce, 1),
        ("kafka produce, orchard bus (encoded bytes)", orchard_produce_bytes, 1),
        ("kafka produce, orchard bus (encode + produce)", orchard_produce, 1),
        ("kafka consume, raw confluent-kafka", raw_consume, 1),
        ("kafka consume, orchard bus (poll)", orchard_consume(decode=False), 2),
        ("kafka consume, orchard bus (poll + decode)", orchard_consume(decode=True), 2),
    ):
        moved, seconds = timed(fn)
        rows.append((label, n, *rate(n * factor, moved * factor, seconds)))
    bus.close()
    return rows


# ------------------------------------------------------------------------------------------------ embedded
def embedded_rows(values: list[bytes], codec: Codec, records: list[dict[str, Any]]) -> list[tuple]:
    """A bare append loop vs Orchard's embedded bus, in a temporary directory."""
    n, total = len(values), sum(len(v) for v in values)
    with tempfile.TemporaryDirectory() as tmp:
        bus: Bus = open_bus(EmbeddedBusConfig(path=Path(tmp) / "bus"))
        bus.create_topic("bench", partitions=4)

        def bare_append() -> int:
            with open(Path(tmp) / "bare.log", "ab") as handle:
                for value in values:
                    handle.write(struct.pack("<I", len(value)))
                    handle.write(value)
            return total

        def bare_read() -> int:
            moved = 0
            with open(Path(tmp) / "bare.log", "rb") as handle:
                while head := handle.read(4):
                    moved += len(handle.read(struct.unpack("<I", head)[0]))
            return moved

        def orchard_produce_bytes() -> int:
            producer = bus.producer()
            for i, value in enumerate(values):
                producer.produce("bench", value, key=b"e%d" % (i % 64))
            producer.flush()
            return total

        def orchard_produce() -> int:
            producer = bus.producer()
            moved = 0
            for i, record in enumerate(records):
                value = codec.encode("ModelCall", record)
                moved += len(value)
                producer.produce("bench", value, key=b"e%d" % (i % 64))
            producer.flush()
            return moved

        def orchard_consume(decode: bool) -> Callable[[], int]:
            def run() -> int:
                consumer = bus.consumer(["bench"])
                got = moved = 0
                while got < 2 * n:
                    for record in consumer.poll(max_records=500, timeout_s=1):
                        if decode:
                            codec.decode(record.value)
                        got += 1
                        moved += len(record.value)
                return moved // 2

            return run

        rows = []
        for label, fn, factor in (
            ("embedded produce, bare file-append loop (encoded bytes)", bare_append, 1),
            ("embedded produce, orchard bus (encoded bytes)", orchard_produce_bytes, 1),
            ("embedded produce, orchard bus (encode + produce)", orchard_produce, 1),
            ("embedded consume, bare file-read loop", bare_read, 1),
            ("embedded consume, orchard bus (poll)", orchard_consume(decode=False), 2),
            ("embedded consume, orchard bus (poll + decode)", orchard_consume(decode=True), 2),
        ):
            moved, seconds = timed(fn)
            rows.append((label, n, *rate(n * factor, moved * factor, seconds)))
        return rows


# ------------------------------------------------------------------------------------------------ bytes
def episode_bytes(codec: Codec, calls: int = 30, delta: bool = True) -> int:
    """Bytes of a ``calls``-call episode whose context grows by each completion plus a ~300-token tool result."""
    rng = np.random.default_rng(1)
    encoder = PrefixDeltaEncoder()
    prompt = rng.integers(0, 150_000, 1024)
    messages = [{"role": "system", "content": text(rng, 200)}, {"role": "user", "content": text(rng, 824)}]
    total = 0
    for k in range(calls):
        completion = rng.integers(0, 150_000, 256)
        sent_messages, base_count = messages, 0
        if delta:
            found = encoder.encode(k, prompt, completion)
            if found.base_call_index is not None:
                base_count = len(messages) - 1  # everything but the newest tool result was already recorded
                sent_messages = messages[base_count:]
            record = model_call(
                rng,
                k,
                found.new_token_ids,
                completion,
                sent_messages,
                base=found.base_call_index,
                prefix_length=found.prefix_length,
                messages_prefix_count=base_count,
            )
        else:
            record = model_call(rng, k, prompt, completion, messages)
        total += len(codec.encode("ModelCall", record))
        tool = rng.integers(0, 150_000, 300)
        prompt = np.concatenate([prompt, completion, tool])
        messages = [
            *messages,
            {"role": "assistant", "content": text(rng, 256)},
            {"role": "tool", "content": text(rng, 300)},
        ]
    return total


def main() -> None:
    """Run every measurement and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--skip-kafka", action="store_true")
    args = parser.parse_args()
    codec = Codec.default()
    rng = np.random.default_rng(0)
    messages = [{"role": "user", "content": text(rng, PROMPT_TOKENS)}]
    records = [
        model_call(
            rng, i, rng.integers(0, 150_000, PROMPT_TOKENS), rng.integers(0, 150_000, COMPLETION_TOKENS), messages
        )
        for i in range(args.records)
    ]
    values = [codec.encode("ModelCall", r) for r in records]
    record_size = sum(len(v) for v in values) / len(values)

    rows: list[tuple] = []
    if not args.skip_kafka:
        bootstrap, stop = start_kafka()
        try:
            rows += kafka_rows(bootstrap, values, codec, records)
        finally:
            stop()
    rows += embedded_rows(values, codec, records)

    table = Table(title=f"ModelCall records ({PROMPT_TOKENS}+{COMPLETION_TOKENS} tokens, {record_size / 1024:.1f} KiB)")
    for column in ("path", "records", "records/s", "MB/s", "vs baseline"):
        table.add_column(column, justify="right" if column != "path" else "left")
    baseline = 0.0
    for i, (label, n, per_s, mb_s) in enumerate(rows):
        if i % 3 == 0:
            baseline = per_s
        table.add_row(label, str(n), f"{per_s:,.0f}", f"{mb_s:,.1f}", f"{per_s / baseline:.2f}x")
    console.print(table)

    with_delta, without = episode_bytes(codec, delta=True), episode_bytes(codec, delta=False)
    sizes = Table(title="Bytes on the bus")
    sizes.add_column("measure")
    sizes.add_column("value", justify="right")
    sizes.add_row("one ModelCall, bytes", f"{record_size:,.0f}")
    tokens = PROMPT_TOKENS + COMPLETION_TOKENS
    packed = 4 * (PROMPT_TOKENS + 2 * COMPLETION_TOKENS)  # int32 ids of both, float32 logprobs of the completion
    sizes.add_row("bytes per token (whole record, with text)", f"{record_size / tokens:.2f}")
    sizes.add_row("bytes per token (packed ids + logprobs only)", f"{packed / tokens:.2f}")
    sizes.add_row("30-call episode, with prefix delta", f"{with_delta:,}")
    sizes.add_row("30-call episode, without prefix delta", f"{without:,}")
    sizes.add_row("saving", f"{without / with_delta:.1f}x")
    console.print(sizes)


if __name__ == "__main__":
    main()
