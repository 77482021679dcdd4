"""A consumer fenced by its own earlier membership (a coordinator broker lost) starts a fresh session every time;
one fenced by another instance with its id stops at once; an unattributed fence stops when it repeats."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.reward_consumer import RewardConsumer
from consumers.rewards import FunctionReward
from consumers.runtime import ConsumerRuntime
from orchard.bus import open_bus
from orchard.bus.exceptions import MemberFencedError
from orchard.config import EmbeddedBusConfig


def runtime(tmp_path: Path) -> ConsumerRuntime:
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    return ConsumerRuntime(bus, RewardConsumer(FunctionReward(lambda s, t: 1.0, name="one")))


def test_a_member_that_fenced_itself_starts_a_fresh_session_however_often(tmp_path: Path) -> None:
    subject = runtime(tmp_path)
    for _ in range(5):  # a broker lost five times in a minute
        subject._note_fenced(MemberFencedError("self", by_another=False))


def test_a_member_fenced_by_another_instance_raises_the_first_time(tmp_path: Path) -> None:
    with pytest.raises(MemberFencedError, match="other"):
        runtime(tmp_path)._note_fenced(MemberFencedError("other", by_another=True))


def test_an_unattributed_fence_is_ridden_out_once_then_raises(tmp_path: Path) -> None:
    subject = runtime(tmp_path)
    subject._note_fenced(MemberFencedError("unknown"))
    with pytest.raises(MemberFencedError, match="unknown"):
        subject._note_fenced(MemberFencedError("unknown"))
