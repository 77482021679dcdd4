"""Server-sent events: split a byte stream into events, and re-encode an event whose data was changed.

Events pass through byte for byte unless the proxy changes their data (stripping the token trace), so a harness sees
exactly what the backend sent. CRLF line endings are normalised to LF. Events are handed on in batches: all the
complete events of what one read from the backend returned, so a backend that writes faster than the proxy reads costs
one write to the harness per read, not one per event (nothing is ever held back waiting for more).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One event: its lines as received, its ``event:`` name, and its ``data:`` lines joined (None: no data)."""

    lines: tuple[str, ...]
    name: str | None
    data: str | None

    @classmethod
    def parse(cls, block: str) -> SseEvent:
        """Parse the text of one event (without the blank line ending it)."""
        lines = tuple(block.split("\n"))
        name, data = None, []
        for line in lines:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
        return cls(lines, name, "\n".join(data) if data else None)

    def encode(self) -> bytes:
        """The event as received, with its terminating blank line."""
        return ("\n".join(self.lines) + "\n\n").encode()

    def with_data(self, data: str) -> bytes:
        """The event with its data replaced by ``data`` (one line), other fields kept."""
        kept = [line for line in self.lines if not line.startswith("data:")]
        return ("\n".join([*kept, f"data: {data}"]) + "\n\n").encode()


async def iter_event_batches(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[SseEvent]]:
    """The events of a byte stream: after each read, every event whose blank line has arrived (if any)."""
    buffer = b""
    async for chunk in chunks:
        buffer = (buffer + chunk).replace(b"\r\n", b"\n")
        *blocks, buffer = buffer.split(b"\n\n")
        events = [SseEvent.parse(block.decode()) for block in blocks if block]
        if events:
            yield events
    if buffer.strip():
        yield [SseEvent.parse(buffer.decode().rstrip("\n"))]
