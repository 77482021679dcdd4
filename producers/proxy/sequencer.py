"""Recording in request order: tickets handed out as requests arrive, recordings run one at a time in ticket order.

``call_index`` is "the order the proxy received the requests", and a prefix delta's base must be recorded before the
calls built on it. Responses are never held back for this: a finished call waits for its turn in the background, and
a call that fails (or whose harness went away) releases its ticket without recording, so it holds up nothing.
"""

from __future__ import annotations

import asyncio


class CallSequencer:
    """Per-episode ordering of recordings (single event loop; not thread-safe)."""

    def __init__(self) -> None:
        """No tickets yet."""
        self._issued = 0
        self._turn = 0
        self._released: set[int] = set()
        self._changed = asyncio.Event()

    @property
    def ticket_count(self) -> int:
        """Tickets handed out so far."""
        return self._issued

    @property
    def in_flight(self) -> int:
        """Tickets handed out and not yet released."""
        return self._issued - self._turn - len(self._released)

    def ticket(self) -> int:
        """The next ticket, in arrival order."""
        self._issued += 1
        return self._issued - 1

    async def wait_turn(self, ticket: int) -> None:
        """Wait until every earlier ticket has been released."""
        while self._turn < ticket:
            await self._changed.wait()

    def release(self, ticket: int) -> bool:
        """Mark ``ticket`` finished (recorded or given up); idempotent, in any order. True if it was still held."""
        if ticket < self._turn or ticket in self._released or ticket >= self._issued:
            return False
        self._released.add(ticket)
        while self._turn in self._released:
            self._released.remove(self._turn)
            self._turn += 1
        self._changed.set()
        self._changed = asyncio.Event()
        return True

    async def drained(self) -> None:
        """Wait until every ticket handed out so far has been released."""
        target = self._issued
        while self._turn < target:
            await self._changed.wait()
