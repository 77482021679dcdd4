"""``DrainGate``: a weight swap waits for requests in flight, holds new ones, and never changes a running version."""

from __future__ import annotations

import asyncio

import pytest

from orchard.engines.drain_gate import DrainGate, DrainTimeoutError, SwapRefusedError
from orchard.engines.exceptions import EngineOverloadedError


async def request(gate: DrainGate, release: asyncio.Event, log: list[tuple[str, int]], name: str) -> int:
    async with gate.serving() as version:
        log.append((f"{name} start", version))
        await release.wait()
        log.append((f"{name} end", version))
        return version


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_swap_waits_for_in_flight_requests_and_new_ones_run_on_the_new_version() -> None:
    gate, log = DrainGate(4), []
    release_old, release_new = asyncio.Event(), asyncio.Event()
    old = asyncio.create_task(request(gate, release_old, log, "old"))
    await settle()

    async def apply() -> None:
        log.append(("load", gate.in_flight))

    swap = asyncio.create_task(gate.swap(5, apply, drain_timeout_s=5))
    await settle()
    new = asyncio.create_task(request(gate, release_new, log, "new"))
    await settle()
    assert (gate.swapping, gate.waiting, gate.in_flight, log) == (True, 1, 1, [("old start", 4)])

    release_old.set()
    release_new.set()
    assert (await old, await new) == (4, 5)
    await swap
    assert log == [("old start", 4), ("old end", 4), ("load", 0), ("new start", 5), ("new end", 5)]
    assert (gate.version, gate.in_flight, gate.waiting, gate.swapping) == (5, 0, 0, False)


@pytest.mark.asyncio
async def test_a_failed_load_keeps_the_old_version_and_reopens_the_gate() -> None:
    gate = DrainGate(2)

    async def apply() -> None:
        raise RuntimeError("worker died")

    with pytest.raises(RuntimeError, match="worker died"):
        await gate.swap(3, apply, drain_timeout_s=1)
    async with gate.serving() as version:
        assert (version, gate.swapping) == (2, False)


@pytest.mark.asyncio
async def test_a_drain_that_times_out_refuses_the_swap_and_the_running_request_is_untouched() -> None:
    gate, log, release = DrainGate(7), [], asyncio.Event()
    running = asyncio.create_task(request(gate, release, log, "long"))
    await settle()
    applied = []

    async def apply() -> None:
        applied.append(True)

    with pytest.raises(DrainTimeoutError, match="1 requests still in flight"):
        await gate.swap(8, apply, drain_timeout_s=0.05)
    release.set()
    assert (await running, gate.version, applied, gate.swapping) == (7, 7, [], False)


@pytest.mark.asyncio
async def test_requests_beyond_max_waiting_are_refused_during_a_swap() -> None:
    gate, release = DrainGate(0, max_waiting=1), asyncio.Event()
    running = asyncio.create_task(request(gate, release, [], "running"))
    await settle()
    swap = asyncio.create_task(gate.swap(1, release.wait, drain_timeout_s=5))
    await settle()
    waiter = asyncio.create_task(gate.enter())
    await settle()
    with pytest.raises(EngineOverloadedError, match="1 requests already wait"):
        await gate.enter()
    release.set()
    await running
    await swap
    assert await waiter == 1
    gate.leave()


@pytest.mark.asyncio
async def test_a_second_swap_while_one_runs_is_refused() -> None:
    gate, release = DrainGate(0), asyncio.Event()
    first = asyncio.create_task(gate.swap(1, release.wait, drain_timeout_s=5))
    await settle()
    with pytest.raises(SwapRefusedError, match="another weight swap"):
        await gate.swap(2, release.wait, drain_timeout_s=5)
    release.set()
    await first
    assert gate.version == 1
