"""Reading a topic until it goes quiet: ``read_until_quiet`` polls a consumer and yields its records until one of the
stopping rules the caller chose holds.

The rules, any combination (at least one):

- ``idle_polls``: that many polls in a row returned nothing;
- ``quiet_s``: no record came for more than that many seconds;
- ``until``: the consumer's position reached these offsets in every partition listed (a partition missing from
  ``position()`` has not). Checked before every poll, so a consumer already there does not poll at all. On Kafka,
  transaction markers take offsets no record has, and a position may stop short of an end offset: pair ``until``
  with ``idle_polls`` or ``quiet_s``;
- ``budget_s``: that many seconds have passed since the first record was asked for (checked before every poll;
  the time the caller spends on the records counts);
- ``max_polls``: that many polls were made.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from orchard.bus.base import Consumer, Record, TopicPartition


def read_until_quiet(
    consumer: Consumer,
    *,
    max_records: int,
    poll_timeout_s: float,
    idle_polls: int | None = None,
    quiet_s: float | None = None,
    until: Mapping[TopicPartition, int] | None = None,
    budget_s: float | None = None,
    max_polls: int | None = None,
) -> Iterator[Record]:
    """The records ``consumer`` polls (``max_records`` at most per poll, each waiting up to ``poll_timeout_s``), in
    the order polled, until a stopping rule holds (see the module docstring); ``ValueError`` without one."""
    if idle_polls is None and quiet_s is None and until is None and budget_s is None and max_polls is None:
        raise ValueError("read_until_quiet needs a stopping rule: idle_polls, quiet_s, until, budget_s or max_polls")
    rules = _Rules(idle_polls, quiet_s, until, budget_s, max_polls)
    return _read(consumer, max_records, poll_timeout_s, rules)


def reached(positions: Mapping[TopicPartition, int], until: Mapping[TopicPartition, int]) -> bool:
    """Whether ``positions`` are at or past ``until`` in every partition of ``until`` (a missing one is not).

    >>> tp = TopicPartition("t", 0)
    >>> reached({tp: 5}, {tp: 5}), reached({}, {tp: 5}), reached({}, {})
    (True, False, True)
    """
    return all(tp in positions and positions[tp] >= offset for tp, offset in until.items())


def _read(consumer: Consumer, max_records: int, poll_timeout_s: float, rules: _Rules) -> Iterator[Record]:
    rules.started = rules.last_record = time.monotonic()  # the clocks start at the first record asked for
    while rules.may_poll(consumer):
        batch = consumer.poll(max_records=max_records, timeout_s=poll_timeout_s)
        yield from batch
        if rules.quiet_after(batch):
            return


@dataclass(slots=True)
class _Rules:
    """The stopping rules of one read and what they count."""

    idle_polls: int | None
    quiet_s: float | None
    until: Mapping[TopicPartition, int] | None
    budget_s: float | None
    max_polls: int | None
    started: float = 0.0
    last_record: float = 0.0
    idle: int = 0
    polls: int = 0

    def may_poll(self, consumer: Consumer) -> bool:
        """Whether no rule checked before a poll holds: the budget, the poll count, the end offsets."""
        if self.budget_s is not None and time.monotonic() - self.started >= self.budget_s:
            return False
        if self.max_polls is not None and self.polls >= self.max_polls:
            return False
        return self.until is None or not reached(consumer.position(), self.until)

    def quiet_after(self, batch: list[Record]) -> bool:
        """Count one poll that returned ``batch``; whether the topic went quiet (empty polls, silent seconds)."""
        now = time.monotonic()
        self.polls += 1
        self.idle = 0 if batch else self.idle + 1
        self.last_record = now if batch else self.last_record
        too_idle = self.idle_polls is not None and self.idle >= self.idle_polls
        return too_idle or (self.quiet_s is not None and now - self.last_record > self.quiet_s)
