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
times its scorer's weight. They are not scaled by the group (a scorer's scale is its own; the weight sets it).
Abstentions (NaN) contribute nothing. Tokens outside completions always get 0.

A dense score added as it is shifts every token of a call the same way whatever the other rollouts did: in a group
whose members all took the same path and all succeeded (the usual group once a policy is good) every read and write
then gets a positive advantage, a gradient that is zero in expectation but not in any one batch, and Adam scales that
noise up to full-size steps (the file-lookup recipe's dense stage lost 40 of the RL stage's wins that way, stop 28).
``dense_baseline="call_index"`` (``baseline_dense_scores``) subtracts a baseline instead: the mean of the *other*
members' scores from the same scorer at the same call index (leave-one-out, so the baseline does not depend on the
member's own actions and the gradient stays unbiased). Members that did the same thing at a call then get 0 there;
a member that did better than its siblings gets a positive score, worse a negative one. A group of one gets no dense
signal (nothing to compare it with, as for the outcome). A call no sibling reached keeps its raw score, and span
scores (``token_start``/``token_end``) are never baselined. Calls are matched by index, whatever conversation they
belong to: a harness with several conversations per episode lines up unrelated calls.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

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


def baseline_dense_scores(members: Sequence[Sequence[DenseScore]]) -> list[list[DenseScore]]:
    """Each member's call-level scores minus the leave-one-out mean of its siblings' scores of the same scorer at
    the same call index (see the module docstring). A score equal to that mean (to rounding) becomes exactly 0, so
    identical siblings leave an all-zero sample that is not emitted. In a group of one there is nothing to compare:
    every call-level score becomes 0, as the outcome advantage does. Span scores, abstentions and calls no sibling
    reached are unchanged.

    >>> read, write = DenseScore("s", 0, 0.5), DenseScore("s", 1, 0.5)
    >>> [[d.score for d in m] for m in baseline_dense_scores([[read, write], [read, write]])]
    [[0.0, 0.0], [0.0, 0.0]]
    >>> detour = [DenseScore("s", 0, -0.1), DenseScore("s", 1, 0.5), DenseScore("s", 2, 0.5)]
    >>> [[round(d.score, 3) for d in m] for m in baseline_dense_scores([detour, [read, write]])]
    [[-0.6, 0.0, 0.5], [0.6, 0.0]]
    """
    by_call: dict[tuple[str, int], list[tuple[int, float]]] = {}  # (scorer, call) -> (member, score)
    for index, member in enumerate(members):
        for score in member:
            if _baselined(score):
                by_call.setdefault((score.scorer, score.call_index), []).append((index, score.score))
    alone = len(members) == 1
    out = []
    for index, member in enumerate(members):
        shifted = []
        for score in member:
            if _baselined(score):
                siblings = [s for i, s in by_call[(score.scorer, score.call_index)] if i != index]
                if alone:
                    score = replace(score, score=0.0)
                elif siblings:
                    mean = math.fsum(siblings) / len(siblings)
                    difference = score.score - mean
                    if abs(difference) <= 1e-9 * max(1.0, abs(score.score)):
                        difference = 0.0  # equal to rounding: (sum - own) / (n - 1) leaves residues like 1e-17
                    score = replace(score, score=difference)
            shifted.append(score)
        out.append(shifted)
    return out


def _baselined(score: DenseScore) -> bool:
    return score.token_start is None and score.token_end is None and math.isfinite(score.score)
