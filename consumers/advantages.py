"""Per-token learning signals: group-relative outcome advantages plus weighted dense scores.

The outcome advantage of an episode in a group of rewards ``r`` is GRPO's ``(r_i - mean(r)) / (std(r) + eps)``,
with the population standard deviation (``ddof=0``: the group is the whole population being compared, and a group
of two then gives +-1 rather than +-0.71). Departures, and why:

- ``std == 0`` (every member got the same reward, which includes a group of one): the advantage is 0 for all.
  There is nothing to rank, so the outcome carries no learning signal (the reason Balanced Adaptive Rollout moves
  rollouts away from tasks that always or never succeed); dividing ``0 / eps`` would be 0 anyway, the explicit
  rule just makes it exact rather than relying on ``eps``;
- ``normalise_std=False`` keeps only the mean baseline (``r_i - mean(r)``, the "Dr. GRPO" variant): the std
  division up-weights groups whose rewards barely differ, which some prefer not to do.
- ``ddof=1`` (the sample standard deviation) with ``eps=1e-4`` gives exactly TRL's ``GRPOTrainer`` advantages
  (``scale_rewards="group"``), which uses Bessel's correction; ``tests/unit/trainers/test_trl_parity.py`` checks
  this against TRL's own code.

Dense scores (``StepScore`` records) are added on top, per token: a call-level score to every token of that call's
completion, a span score to the tokens of its span (``token_start``..``token_end`` of the call's completion), each
times its scorer's weight. They are not group-normalised (a scorer's scale is its own; the weight sets it).
Abstentions (NaN) contribute nothing. Tokens outside completions always get 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from consumers.sequences import TokenSequence


@dataclass(frozen=True, slots=True)
class DenseScore:
    """One dense score of one call, or of a span of its completion tokens (``token_start``..``token_end``)."""

    scorer: str
    call_index: int
    score: float
    token_start: int | None = None
    token_end: int | None = None


def group_advantages(
    rewards: Sequence[float], *, eps: float = 1e-6, normalise_std: bool = True, ddof: int = 0
) -> list[float]:
    """GRPO-style group-relative advantages of ``rewards`` (see the module docstring for the std == 0 rule); the
    std divides by ``n - ddof`` (0: population, 1: sample, as TRL).

    >>> [round(a, 4) for a in group_advantages([1.0, 0.0, 0.0, 1.0])]
    [1.0, -1.0, -1.0, 1.0]
    >>> [round(a, 4) for a in group_advantages([1.0, 0.0, 0.0, 1.0], ddof=1)]
    [0.866, -0.866, -0.866, 0.866]
    >>> group_advantages([0.5, 0.5, 0.5])
    [0.0, 0.0, 0.0]
    """
    if not rewards:
        return []
    values = np.asarray(rewards, dtype=np.float64)
    centred = values - values.mean()
    if len(values) <= ddof:
        return [0.0] * len(values)  # a group of one has no sample std: nothing to rank either
    std = float(values.std(ddof=ddof))
    if std == 0.0:
        return [0.0] * len(values)
    return [float(x) for x in (centred / (std + eps) if normalise_std else centred)]


def dense_token_scores(
    sequence: TokenSequence, scores: Iterable[DenseScore], weights: Mapping[str, float]
) -> npt.NDArray[np.float32]:
    """Per-token sum of ``weight * score`` over the scores that fall in ``sequence`` (0 elsewhere)."""
    out = np.zeros(len(sequence.token_ids), dtype=np.float64)
    spans = {span.call_index: span for span in sequence.spans}
    for score in scores:
        span = spans.get(score.call_index)
        weight = weights.get(score.scorer)
        if span is None or weight is None or not math.isfinite(score.score):
            continue  # another sequence's call, an unweighted scorer, or an abstention
        start = span.start + max(0, score.token_start or 0)
        end = span.end if score.token_end is None else min(span.end, span.start + score.token_end)
        if start < end:
            out[start:end] += weight * score.score
    return out.astype(np.float32)
