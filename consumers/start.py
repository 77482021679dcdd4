"""Where a consumer starts reading when its group has no committed offset yet (``--start``, ``runtime.start``).

A consumer group started in a later stage of a run (a dense-reward consumer in the SWE recipe's ``dense`` stage) is
new, so it would start at the beginning of ``trajectories`` and score every earlier stage's episodes before the ones
its stage is waiting for. Its start position says where to begin instead, for partitions without a committed offset
only (a restarted consumer always resumes from its commits):

- ``earliest``: the first record (the default: a new consumer sees everything);
- ``latest``: the end of each partition when the consumer joins;
- a time (milliseconds since the epoch, or an ISO 8601 time with its zone): the first record at or after it;
- ``stage``: the time the run stage that started the consumer began, which ``orchard run`` passes to the
  components a stage starts in ``$ORCHARD_STAGE_STARTED_MS`` (on a resume, the interrupted stage's first start).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

from orchard.exceptions import ConfigError

if TYPE_CHECKING:  # orchard.config imports this module: importing the bus package here would be circular
    from orchard.bus.base import StartPosition

STAGE_STARTED_ENV = "ORCHARD_STAGE_STARTED_MS"
"""Set by ``orchard run`` for the components a stage starts: the stage's start, in milliseconds since the epoch."""
ConsumerStart = Literal["earliest", "latest", "stage"] | Annotated[int, Field(ge=0)]
"""A consumer's configured start: a bus start position, or ``stage`` (resolved by ``resolve_start``)."""


def parse_start(text: str) -> ConsumerStart:
    """The start position a ``--start`` option names.

    >>> parse_start("stage"), parse_start("1700000000000"), parse_start("2023-11-14T22:13:20Z")
    ('stage', 1700000000000, 1700000000000)
    """
    if text in ("earliest", "latest", "stage"):
        return text  # type: ignore[return-value]  # narrowed by the test above
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise ConfigError(
            f"--start {text!r}: give earliest, latest, stage, a time in ms since the epoch, or an ISO 8601 time "
            "with its zone (2026-12-01T10:00:00Z)"
        )
    return round(moment.timestamp() * 1000)


def resolve_start(start: ConsumerStart, environ: Mapping[str, str]) -> StartPosition:
    """The bus start position of ``start``: ``stage`` becomes ``$ORCHARD_STAGE_STARTED_MS`` from ``environ``.

    >>> resolve_start("stage", {"ORCHARD_STAGE_STARTED_MS": "1700000000000"}), resolve_start("latest", {})
    (1700000000000, 'latest')
    """
    if start != "stage":
        return start
    value = environ.get(STAGE_STARTED_ENV, "")
    if not value.isdigit():
        raise ConfigError(
            f"start 'stage' needs ${STAGE_STARTED_ENV} (milliseconds since the epoch), which `orchard run` sets for "
            f"the components a stage starts; got {value!r}. Outside a staged run give a time instead."
        )
    return int(value)
