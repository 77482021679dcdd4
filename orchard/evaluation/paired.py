"""Paired comparison of two stages on the same held-out tasks: the exact McNemar test.

Each task evaluated in both stages is one pair. A **win** is a task the later stage solves and the earlier one does
not, a **loss** the reverse; pairs both solve or both fail (concordant) say nothing about which stage is better and
do not enter the test. Under the null hypothesis that the two stages are equally good, each discordant pair is a
win with probability 1/2, so ``wins ~ Binomial(wins + losses, 1/2)`` and the two-sided exact p-value is
``min(1, 2 * P(X <= min(wins, losses)))``. The exact binomial, not the chi-square approximation, because the
discordant counts of a held-out split are small; it is computed with integer binomial coefficients (no scipy).

A paired test is more powerful than comparing the two success rates' intervals: the stages are run on the same
tasks, and task difficulty, the largest source of variance, cancels out of each pair.

Pairing is by task id. A task evaluated in only one of the stages (another split, a task added later) is left out,
and ``PairedTest.pairs`` says how many tasks were compared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PairedTest:
    """A stage against ``baseline`` on their ``pairs`` common tasks: ``wins`` and ``losses`` (discordant pairs) and
    the two-sided exact McNemar ``p_value``."""

    baseline: str
    pairs: int
    wins: int
    losses: int
    p_value: float


def mcnemar_exact_p(wins: int, losses: int) -> float:
    """The two-sided exact McNemar p-value of ``wins`` against ``losses`` discordant pairs.

    >>> mcnemar_exact_p(8, 1)  # 2 * (C(9,0) + C(9,1)) / 2**9
    0.0390625
    >>> mcnemar_exact_p(3, 3), mcnemar_exact_p(0, 0)
    (1.0, 1.0)
    >>> mcnemar_exact_p(0, 6)  # 2 / 2**6
    0.03125
    """
    if wins < 0 or losses < 0:
        raise ValueError(f"wins and losses must be non-negative, got {wins} and {losses}")
    n = wins + losses
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1))
    return min(1.0, 2 * tail / 2**n)  # int / int is correctly rounded, however large 2**n is


def paired_test(baseline: str, before: Mapping[str, bool], after: Mapping[str, bool]) -> PairedTest:
    """``after`` (per task id: solved?) against ``before`` on the tasks both have.

    >>> paired_test("sft", {"a": False, "b": True, "c": False}, {"a": True, "b": True, "d": True})
    PairedTest(baseline='sft', pairs=2, wins=1, losses=0, p_value=1.0)
    """
    common = before.keys() & after.keys()
    wins = sum(1 for task in common if after[task] and not before[task])
    losses = sum(1 for task in common if before[task] and not after[task])
    return PairedTest(baseline, len(common), wins, losses, mcnemar_exact_p(wins, losses))
