"""``poll_through_self_fence`` rejoins a consumer that fenced itself and raises any other fence."""

from __future__ import annotations

import pytest

from orchard.bus.base import Record, poll_through_self_fence
from orchard.bus.exceptions import MemberFencedError


class FencedOnce:
    """A consumer whose first poll fails with ``fence``; it counts rejoins."""

    def __init__(self, fence: MemberFencedError) -> None:
        self.fence: MemberFencedError | None = fence
        self.rejoins = 0

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        if self.fence is not None:
            fence, self.fence = self.fence, None
            raise fence
        return [Record("t", 0, 7, 0, None, b"x")]

    def rejoin(self) -> None:
        self.rejoins += 1


def test_a_consumer_that_fenced_itself_rejoins_and_polls_on() -> None:
    consumer = FencedOnce(MemberFencedError("self", by_another=False))
    first = poll_through_self_fence(consumer)  # type: ignore[arg-type]
    second = poll_through_self_fence(consumer)  # type: ignore[arg-type]
    assert (first, [r.offset for r in second], consumer.rejoins) == ([], [7], 1)


@pytest.mark.parametrize("by_another", [True, None])
def test_a_fence_by_another_or_by_nobody_known_is_raised_without_rejoining(by_another: bool | None) -> None:
    consumer = FencedOnce(MemberFencedError("fenced", by_another=by_another))
    with pytest.raises(MemberFencedError):
        poll_through_self_fence(consumer)  # type: ignore[arg-type]
    assert consumer.rejoins == 0
