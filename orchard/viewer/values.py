"""Turning decoded record values into what JSON carries: times in epoch milliseconds, floats only when finite.

The app answers with strict JSON (no ``NaN``): a scorer that abstained writes a NaN score, a logprob may be ``-inf``;
both reach the page as ``null``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from typing import Any


def ms(value: Any) -> int | None:
    """Milliseconds since the epoch of a decoded ``timestamp-millis`` field (a datetime, or already an int).

    >>> from datetime import UTC
    >>> ms(datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)), ms(1500), ms(None)
    (1000, 1500, None)
    """
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number, else None.

    >>> finite(0.5), finite(float("nan")), finite(float("-inf")), finite("x")
    (0.5, None, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def finite_list(values: Iterable[Any]) -> list[float | None]:
    """``finite`` of each value (e.g. of a numpy array's ``tolist()``)."""
    return [finite(value) for value in values]
