"""Credit assignment for SFT on partially successful attempts: a weight per model call.

A failed attempt at a task is not worthless: an agent that reproduced the bug, wrote a test for it and edited the
right file, then botched the final edit, showed most of the behaviour a successful agent shows. Credit-assignment
SFT trains on those productive fragments and not on the rest. This module decides, call by call, which fragments
those are; the sample builder turns a call's weight into the SFT weight of every token the call generated.

The rules, in order (``CreditConfig`` holds every number):

1. **Successful attempts** (``Trajectory.success``): every call gets ``success_weight`` (1.0) — a solved task is a
   demonstration. With ``zero_unproductive_in_successes`` the vetoed calls of rule 3 get 0 even here.
2. **Attempts that were not credited**: a failed attempt whose status is not in ``credited_statuses`` (by default
   CRASHED and CANCELLED: the harness or the scheduler ended it, so its steps say little about the policy) gets 0.
3. **Vetoes** (weight 0, whatever else holds): a call cut off by the length limit (its tool call is truncated); a
   call whose every action was *invalid* (malformed arguments, an unknown tool, a command not found) or *repeated*
   (the same command as an earlier one with no file edited in between: nothing new could come of it).
4. **Productive actions** of a failed attempt, each with a weight (``CreditWeights``); a call gets the largest
   weight among its actions' tags (not the sum: one call doing two useful things is still one good call):

   ========================  =====  ===========================================================================
   tag                       w      detected when
   ========================  =====  ===========================================================================
   ``reproduced``            1.0    the first run of tests or a program that failed, before any source edit
   ``wrote_test``            1.0    wrote a test file or a reproduction script (``tests/``, ``test_*``, ``repro*``)
   ``edited_fix_file``       1.0    edited a file the fix needed (below)
   ``verified``              1.0    a run of tests or a program that succeeded after a source edit
   ``ran_tests``             0.5    ran a test runner (pytest, go test, npm test, ...)
   ``edited_source``         0.25   edited some other non-test file (may be right, may be noise)
   ``inspected_fix_file``    0.25   read a file the fix needed
   (anything else)           0.0    exploration that led nowhere identifiable, the final submit, plain text
   ========================  =====  ===========================================================================

   Writes to scratch space (``/tmp``, ``/dev``) are no edits, unless the file is a test or a reproduction script.

   *Files the fix needed* are the non-test files that the successful attempts of the same rollout group edited
   (the sample builder passes them as ``fix_files``): the grader does not say which files matter, but a sibling
   that solved the task does. Without a successful sibling, edits count as ``edited_source``.
5. **Step scores**: for each scorer in ``score_credit`` (e.g. a process reward model), a call-level score clipped to
   [0, 1] times its weight is one more candidate for the call's maximum — a PRM can credit a call the rules missed,
   but not lift a vetoed one. Span scores and abstentions (NaN) are ignored here.
6. **Partial progress** scales a failed attempt's weights: ``factor = floor + (1 - floor) * progress``, where
   ``progress`` is the mean of the ``progress_signals`` the outcome carries (e.g. ``tests_passed_fraction``), clipped
   to [0, 1], and 0 when none is present. An attempt that got 80% of the tests passing earns its fragments more
   trust than one that got none; the floor (0.5) keeps fragments of a 0%-progress attempt, which can still show
   the right method.

Why these choices: the tags are the behaviours the Orchard-SWE recipe rewards (reproduce, write tests, fix the right
file, verify) and can be read from the transcript alone; the vetoes remove the tokens that teach loops and typos.
The rules are tuned for coding agents; for other recipes (GUI, assistant) rely on ``score_credit`` and progress.
The detection heuristics (which shell text counts as an edit or a test run) live in ``consumers.actions``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from consumers.actions import Action, is_scratch_path, is_test_path, same_file, trajectory_actions
from orchard.trajectory import Trajectory

VETO_TAGS = frozenset({"invalid", "repeated", "truncated"})


class CreditWeights(BaseModel):
    """The weight of each productive tag in a failed attempt (before the progress factor)."""

    model_config = ConfigDict(extra="forbid")

    reproduced: float = Field(1.0, ge=0, description="First failing run of tests or a program before any source edit.")
    wrote_test: float = Field(1.0, ge=0, description="Wrote a test file or a reproduction script.")
    edited_fix_file: float = Field(1.0, ge=0, description="Edited a file a successful sibling attempt edited.")
    verified: float = Field(1.0, ge=0, description="A run of tests or a program that succeeded after a source edit.")
    ran_tests: float = Field(0.5, ge=0, description="Ran a test runner.")
    edited_source: float = Field(0.25, ge=0, description="Edited a non-test file not known to be needed.")
    inspected_fix_file: float = Field(0.25, ge=0, description="Read a file a successful sibling attempt edited.")


class CreditConfig(BaseModel):
    """The credit-assignment rule set (see the module docstring for the rules and their reasoning)."""

    model_config = ConfigDict(extra="forbid")

    success_weight: float = Field(1.0, ge=0, description="Weight of every call of a successful attempt.")
    weights: CreditWeights = Field(default_factory=CreditWeights, description="Weights of productive tags.")
    progress_signals: list[str] = Field(
        default_factory=lambda: ["tests_passed_fraction"],
        description="Outcome signals (0..1) whose mean is a failed attempt's partial progress.",
    )
    progress_floor: float = Field(
        0.5, ge=0, le=1, description="Progress factor of a failed attempt with no progress (1.0 at full progress)."
    )
    score_credit: dict[str, float] = Field(
        default_factory=dict, description="Scorer name -> weight: call-level step scores (clipped to [0, 1]) as credit."
    )
    credited_statuses: list[str] = Field(
        default_factory=lambda: ["FAILED", "TIMED_OUT"],
        description="Statuses of failed attempts that can earn partial credit; others get 0.",
    )
    zero_unproductive_in_successes: bool = Field(
        False, description="Apply the vetoes (invalid, repeated, truncated calls) to successful attempts too."
    )


@dataclass(frozen=True, slots=True)
class StepFacts:
    """What credit assignment needs to know about one call (computable once, when the trajectory arrives)."""

    call_index: int
    actions: tuple[Action, ...]
    truncated: bool = False  # generation hit the length limit

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "call_index": self.call_index,
            "truncated": self.truncated,
            "actions": [action.to_json() for action in self.actions],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepFacts:
        """The facts ``to_json`` wrote."""
        actions = tuple(Action.from_json(action) for action in data["actions"])
        return cls(call_index=data["call_index"], actions=actions, truncated=data["truncated"])


@dataclass(frozen=True, slots=True)
class StepCredit:
    """The credit of one call: its weight and the tags that explain it."""

    call_index: int
    weight: float
    tags: tuple[str, ...] = ()


StepScores = Mapping[str, Mapping[int, float]]
"""Call-level step scores: scorer name -> call index -> score (NaN: abstained)."""


def step_facts(trajectory: Trajectory) -> tuple[StepFacts, ...]:
    """The facts of every step of ``trajectory``, in call order."""
    actions = trajectory_actions(trajectory.steps)
    return tuple(
        StepFacts(step.call_index, step_actions, truncated=step.finish_reason == "length")
        for step, step_actions in zip(trajectory.steps, actions, strict=True)
    )


def assign_credit(
    trajectory: Trajectory,
    config: CreditConfig,
    *,
    step_scores: StepScores | None = None,
    fix_files: Collection[str] = (),
) -> tuple[StepCredit, ...]:
    """The credit of every call of ``trajectory``, in call order."""
    return credit_steps(
        step_facts(trajectory),
        config,
        success=trajectory.success,
        status=trajectory.status,
        signals=trajectory.signals,
        step_scores=step_scores,
        fix_files=fix_files,
    )


def credit_steps(
    facts: Sequence[StepFacts],
    config: CreditConfig,
    *,
    success: bool,
    status: str | None,
    signals: Mapping[str, float],
    step_scores: StepScores | None = None,
    fix_files: Collection[str] = (),
) -> tuple[StepCredit, ...]:
    """Apply the rules of the module docstring to the facts of one attempt's calls."""
    tags = _tag_steps(facts, fix_files)
    if success:
        veto = config.zero_unproductive_in_successes
        return tuple(
            StepCredit(f.call_index, 0.0 if veto and _vetoed(t) else config.success_weight, t)
            for f, t in zip(facts, tags, strict=True)
        )
    if status not in config.credited_statuses:
        return tuple(StepCredit(f.call_index, 0.0, (*t, "not_credited")) for f, t in zip(facts, tags, strict=True))
    factor = progress_factor(signals, config)
    credits = []
    for step, step_tags in zip(facts, tags, strict=True):
        weight = 0.0 if _vetoed(step_tags) else _best_weight(step, step_tags, config, step_scores or {})
        credits.append(StepCredit(step.call_index, weight * factor, step_tags))
    return tuple(credits)


def progress_factor(signals: Mapping[str, float], config: CreditConfig) -> float:
    """``floor + (1 - floor) * progress``: how much a failed attempt's productive calls are trusted."""
    values = [float(signals[name]) for name in config.progress_signals if name in signals]
    values = [value for value in values if math.isfinite(value)]
    progress = min(1.0, max(0.0, sum(values) / len(values))) if values else 0.0
    return config.progress_floor + (1.0 - config.progress_floor) * progress


def fix_files_of(attempts: Iterable[Sequence[StepFacts]]) -> frozenset[str]:
    """The non-test files edited by the given (successful) attempts: the files the fix needed."""
    return frozenset(
        path
        for facts in attempts
        for step in facts
        for action in step.actions
        if not action.invalid
        for path in action.edited
        if not is_test_path(path) and not is_scratch_path(path)
    )


def _tag_steps(facts: Sequence[StepFacts], fix_files: Collection[str]) -> list[tuple[str, ...]]:
    """Tags of every step, walking the attempt in order (what counts depends on what came before)."""
    history = _History()
    out = []
    for step in facts:
        tags: list[str] = ["truncated"] if step.truncated else []
        for action in step.actions:
            tags.extend(history.tag(action, fix_files))
        out.append(tuple(dict.fromkeys(tags)))
    return out


class _History:
    """What an attempt has done so far: the commands run since the last edit, source edits, a reproduction."""

    def __init__(self) -> None:
        self.since_edit: set[str] = set()
        self.edited_source = False
        self.reproduced = False

    def tag(self, action: Action, fix_files: Collection[str]) -> list[str]:
        if action.invalid:
            return ["invalid"]
        if action.key in self.since_edit:
            return ["repeated"]
        tags = [_edit_tag(path, fix_files) for path in action.edited if not _scratch(path)]
        tags += ["inspected_fix_file" for path in action.read if _is_fix_file(path, fix_files)]
        if action.runs_tests:
            tags.append("ran_tests")
        failed = action.exit_code not in (None, 0) or (action.exit_code is None and action.error_output)
        if action.runs_code and failed and not self.edited_source and not self.reproduced:
            tags.append("reproduced")
            self.reproduced = True
        if action.runs_code and action.exit_code == 0 and self.edited_source:
            tags.append("verified")
        if any(not _scratch(path) for path in action.edited):
            self.since_edit.clear()
            self.edited_source |= any(not is_test_path(path) and not _scratch(path) for path in action.edited)
        self.since_edit.add(action.key)
        return tags


def _scratch(path: str) -> bool:
    """A non-test file in scratch space: no edit of the project (a ``/tmp/repro.py`` still counts as a test)."""
    return is_scratch_path(path) and not is_test_path(path)


def _edit_tag(path: str, fix_files: Collection[str]) -> str:
    if is_test_path(path):
        return "wrote_test"
    return "edited_fix_file" if _is_fix_file(path, fix_files) else "edited_source"


def _is_fix_file(path: str, fix_files: Collection[str]) -> bool:
    return any(same_file(path, fix) for fix in fix_files)


def _vetoed(tags: Sequence[str]) -> bool:
    """Truncated, or only vetoed actions (a step with no action at all is not vetoed: scores may credit it)."""
    return "truncated" in tags or (bool(tags) and all(tag in VETO_TAGS for tag in tags))


def _best_weight(step: StepFacts, tags: Sequence[str], config: CreditConfig, scores: StepScores) -> float:
    weights = config.weights.model_dump()
    candidates = [weights[tag] for tag in tags if tag in weights]
    for scorer, weight in config.score_credit.items():
        score = scores.get(scorer, {}).get(step.call_index)
        if score is not None and math.isfinite(score):
            candidates.append(weight * min(1.0, max(0.0, score)))
    return max(candidates, default=0.0)
