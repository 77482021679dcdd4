"""``DrainGate``: swap an engine's weights between requests, so each request finishes on the version it started on.

An engine that cannot hold two versions at once (vLLM updates its weights in place) serves requests through the
gate: ``serving()`` admits a request and tells it the policy version it runs on. ``swap(version, apply)``:

1. closes the gate: requests that arrive from now on wait (at most ``max_waiting`` of them; more are refused with
   ``EngineOverloadedError``, HTTP 503);
2. waits for every request in flight to finish (at most ``drain_timeout_s``; past it the swap is refused with
   ``DrainTimeoutError`` and nothing changed);
3. runs ``apply()`` (load the weights, reset caches); if it raises, the version stays what it was;
4. sets the new version and reopens the gate: the waiting requests run on the new weights.

All of it runs on one asyncio loop (no locks: nothing between a check and its update awaits). Compared with the
local engine, which keeps the old weights stepping beside the new ones and never pauses, the price is a pause of
the longest in-flight request plus the load; the gain is one copy of the weights in GPU memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from orchard.engines.exceptions import EngineError, EngineOverloadedError


class SwapRefusedError(EngineError):
    """A weight swap did not happen (another is in progress, or the drain timed out); the old version serves."""


class DrainTimeoutError(SwapRefusedError):
    """Requests in flight did not finish within the drain timeout; the swap was abandoned."""


class DrainGate:
    """Admits requests on the current policy version and swaps versions between them; see the module docstring."""

    def __init__(self, version: int, *, max_waiting: int | None = None) -> None:
        self._version = version
        self._in_flight = 0
        self._waiting = 0
        self.max_waiting = max_waiting
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()
        self._open.set()
        self._swapping = False

    @property
    def version(self) -> int:
        """The policy version new requests run on (once the gate is open)."""
        return self._version

    @property
    def in_flight(self) -> int:
        """Requests admitted and not finished."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        """Requests held at the closed gate."""
        return self._waiting

    @property
    def swapping(self) -> bool:
        """Whether a swap is draining or loading."""
        return self._swapping

    async def enter(self) -> int:
        """Admit one request (waiting while a swap runs); return the version it runs on. Pair with ``leave``."""
        if not self._open.is_set():
            if self.max_waiting is not None and self._waiting >= self.max_waiting:
                raise EngineOverloadedError(
                    f"{self._waiting} requests already wait for a weight swap to finish; retry shortly"
                )
            self._waiting += 1
            try:
                while not self._open.is_set():
                    await self._open.wait()
            finally:
                self._waiting -= 1
        self._in_flight += 1
        self._idle.clear()
        return self._version

    def leave(self) -> None:
        """One admitted request finished (or failed, or was cancelled)."""
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[int]:
        """``async with gate.serving() as version:`` around one request."""
        version = await self.enter()
        try:
            yield version
        finally:
            self.leave()

    async def swap(self, version: int, apply: Callable[[], Awaitable[None]], *, drain_timeout_s: float) -> float:
        """Drain, ``apply()``, then serve ``version``; return the seconds the gate was closed."""
        if self._swapping:
            raise SwapRefusedError(f"version {version}: another weight swap is in progress")
        self._swapping = True
        self._open.clear()
        closed_at = asyncio.get_running_loop().time()
        try:
            try:
                await asyncio.wait_for(self._idle.wait(), drain_timeout_s)
            except TimeoutError as exc:
                raise DrainTimeoutError(
                    f"version {version}: {self._in_flight} requests still in flight after {drain_timeout_s:g} s; "
                    f"still serving version {self._version}"
                ) from exc
            await apply()
            self._version = version
        finally:
            self._swapping = False
            self._open.set()
        return asyncio.get_running_loop().time() - closed_at
