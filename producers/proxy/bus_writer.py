"""The proxy's one producer, driven by one dedicated thread so the event loop never waits on the bus.

Recording a call (prefix delta, Avro encoding) is CPU work done on the event loop, after the answer went out; the
encoded record is put on a queue, and the writer thread hands what is queued to the producer and flushes it: every
``flush_interval_s`` when anything was queued, and at once when the event loop asks (an episode closing). A call
costs the event loop one append to a queue, and no thread switch: the writer wakes on its timer or on a flush
request, never per record. A flush request covers everything queued before it; the producer (not thread-safe on the
embedded backend) is only ever used by the writer thread.

``producer`` is what recorders publish through: its ``produce`` checks the size limit at once (a refused record is an
error for the caller, as with any producer) and queues the rest; a record the bus fails to take is reported to its
delivery callback with the error.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any

from orchard.bus import DeliveryError, Producer
from orchard.bus.base import Delivery, DeliveryCallback
from orchard.logging import get_logger

log = get_logger("proxy.bus_writer")

Pending = tuple[str, bytes, bytes | None, dict[str, Any]]
Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class BusWriter:
    """Owns a producer and the thread that uses it."""

    def __init__(self, producer: Producer, *, flush_interval_s: float, flush_timeout_s: float) -> None:
        """Take ownership of ``producer`` (closed by ``close``)."""
        self.target = producer
        self.producer: Producer = _QueuedProducer(self)
        self._pending: collections.deque[Pending] = collections.deque()  # appended by the loop, drained by the writer
        self._waiters: collections.deque[Waiter] = collections.deque()
        self._wake = threading.Event()
        self._stopping = False
        self._interval, self._timeout = flush_interval_s, flush_timeout_s
        self._thread = threading.Thread(target=self._run, name="orchard-proxy-bus", daemon=True)
        self.flushes = 0

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    def enqueue(self, topic: str, value: bytes, key: bytes | None, kwargs: dict[str, Any]) -> None:
        """Queue a record for the writer thread (appended at its next wake-up)."""
        self._pending.append((topic, value, key, kwargs))

    async def flush(self) -> None:
        """Wait until everything queued so far is acknowledged; ``DeliveryError`` if the flush failed."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._waiters.append((loop, done))
        self._wake.set()
        await done

    async def close(self) -> None:
        """Write and flush what is queued, stop the thread, close the producer."""
        if self._thread.is_alive():
            self._stopping = True
            self._wake.set()
            await asyncio.to_thread(self._thread.join)
        try:
            await asyncio.to_thread(self.target.close)
        except DeliveryError as exc:
            log.error("records lost at shutdown", error=str(exc))

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            stopping = self._stopping
            waiters = [self._waiters.popleft() for _ in range(len(self._waiters))]  # before draining: covered
            wrote = self._drain()
            error: BaseException | None = None
            if wrote or waiters or stopping:
                try:
                    self._flush()
                except Exception as exc:  # the delivery callbacks counted the failures
                    log.warning("flush failed", error=str(exc))
                    error = exc
            for loop, future in waiters:
                loop.call_soon_threadsafe(_settle, future, error)
            if stopping:
                return

    def _drain(self) -> int:
        count = 0
        while self._pending:
            topic, value, key, kwargs = self._pending.popleft()
            count += 1
            try:
                self.target.produce(topic, value, key, **kwargs)
            except Exception as exc:  # the record never left: tell its callback, like a failed delivery
                callback: DeliveryCallback | None = kwargs.get("on_delivery")
                if callback is None:
                    log.error("record dropped", topic=topic, error=str(exc))
                else:
                    callback(Delivery(topic, -1, -1, f"{type(exc).__name__}: {exc}"))
        return count

    def _flush(self) -> None:
        self.target.flush(self._timeout)
        self.flushes += 1


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


class _QueuedProducer(Producer):
    """The producer recorders see: size checked now, the record appended by the writer thread."""

    def __init__(self, writer: BusWriter) -> None:
        super().__init__(writer.target.max_record_bytes)
        self._writer = writer

    def record_limit(self, topic: str) -> tuple[int, str]:
        """The target producer's limit (it knows the topic's own limit)."""
        return self._writer.target.record_limit(topic)

    def produce(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Check the size (``RecordTooLargeError`` now), then queue the record."""
        self.check_size(topic, key, value)
        self._writer.enqueue(
            topic, value, key, {"partition": partition, "timestamp_ms": timestamp_ms, "on_delivery": on_delivery}
        )

    def flush(self, timeout_s: float = 30.0) -> None:
        """Not available here: flush through ``BusWriter.flush``."""
        raise NotImplementedError("flush through BusWriter.flush()")

    def close(self) -> None:
        """Nothing to release (the writer owns the real producer)."""
