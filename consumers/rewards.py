"""The reward plug-in API: write a class (hooks per step, per episode, per group) or a plain function.

A plug-in never touches the bus: Orchard runs it as its own consumer group over assembled trajectories
(``orchard consumer run mypackage.rewards:MyReward``) and publishes what it returns as ``StepScore`` records
on the ``scores`` topic, where the sample builder picks them up (weights per scorer name in config).

Example::

    from consumers.rewards import RewardPlugin, Score

    class RanTheTests(RewardPlugin):
        name = "ran_the_tests"

        def score_step(self, step, trajectory):
            return 1.0 if "pytest" in step.response_text else 0.0

    # or, as a plain function (its name is the scorer name):
    def short_answers(step, trajectory):
        return -len(step.completion_token_ids) / 1000
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from orchard.exceptions import OrchardError
from orchard.trajectory import Step, Trajectory


class RewardPluginError(OrchardError):
    """A reward plug-in could not be found, loaded or built."""


@dataclass(frozen=True, slots=True)
class Score:
    """One dense score of one call (or a span of its completion tokens, ``token_start``..``token_end``)."""

    call_index: int
    score: float
    token_start: int | None = None
    token_end: int | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


StepResult = float | Score | Iterable[Score] | None
StepFunction = Callable[[Step, Trajectory], StepResult]


class RewardPlugin:
    """Base class of reward plug-ins. Override any of the three hooks; the defaults cascade downwards.

    - ``score_group`` sees every trajectory of a rollout group (set ``needs_groups = True`` to be fed groups: the
      reward consumer then holds trajectories until their group is complete or timed out);
    - ``score_episode`` sees one whole trajectory;
    - ``score_step`` sees one step: return a float (the whole call), a ``Score``, several, or None to abstain.
    """

    name: ClassVar[str] = ""
    needs_groups: ClassVar[bool] = False

    @property
    def scorer_name(self) -> str:
        """The name scores are published under (``name``, or the class name in snake case)."""
        return self.name or _snake_case(type(self).__name__)

    def score_step(self, step: Step, trajectory: Trajectory) -> StepResult:
        """Score one step; None abstains."""
        return None

    def score_episode(self, trajectory: Trajectory) -> list[Score]:
        """Score one trajectory; by default, every step through ``score_step``."""
        scores: list[Score] = []
        for step in trajectory.steps:
            scores.extend(normalise_step_result(step, self.score_step(step, trajectory)))
        return scores

    def score_group(self, trajectories: Sequence[Trajectory]) -> dict[str, list[Score]]:
        """Score a rollout group; by default, each trajectory through ``score_episode``. Keyed by episode id."""
        return {trajectory.episode_id: self.score_episode(trajectory) for trajectory in trajectories}


class FunctionReward(RewardPlugin):
    """Adapts a plain ``(step, trajectory) -> float | Score | None`` function into a plug-in."""

    def __init__(self, function: StepFunction, name: str | None = None) -> None:
        """Wrap ``function``; its scorer name is ``name`` or the function's own name."""
        self._function = function
        self._name = name or getattr(function, "__name__", "function_reward")

    @property
    def scorer_name(self) -> str:
        """The wrapped function's name (or the name given)."""
        return self._name

    def score_step(self, step: Step, trajectory: Trajectory) -> StepResult:
        """Call the wrapped function."""
        return self._function(step, trajectory)


def normalise_step_result(step: Step, result: StepResult) -> list[Score]:
    """Turn what ``score_step`` returned into a list of ``Score``s (a bare number scores the whole call)."""
    if result is None:
        return []
    if isinstance(result, Score):
        return [result]
    if isinstance(result, bool | int | float):
        return [Score(step.call_index, float(result))]
    scores = list(result)
    for score in scores:
        if not isinstance(score, Score):
            raise RewardPluginError(f"score_step returned {type(score).__name__} in a list; expected Score objects")
    return scores


_REGISTRY: dict[str, Callable[[], RewardPlugin]] = {}


def register_reward(name: str) -> Callable[[Any], Any]:
    """Class or function decorator: make a plug-in loadable by ``name`` (``orchard consumer run NAME``)."""

    def decorate(target: Any) -> Any:
        if name in _REGISTRY:
            raise RewardPluginError(f"a reward plug-in named {name!r} is already registered")
        _REGISTRY[name] = lambda: _instantiate(target, name)
        return target

    return decorate


def registered_rewards() -> list[str]:
    """Names of the registered plug-ins, sorted."""
    return sorted(_REGISTRY)


def load_reward(spec: str) -> RewardPlugin:
    """A plug-in from a registered name or a ``package.module:attribute`` path (class, instance or function)."""
    if spec in _REGISTRY:
        return _REGISTRY[spec]()
    if ":" not in spec:
        known = ", ".join(registered_rewards()) or "none"
        raise RewardPluginError(
            f"unknown reward plug-in {spec!r}: not a registered name (registered: {known}) and not 'module:attribute'"
        )
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise RewardPluginError(f"cannot import module {module_name!r} of reward plug-in {spec!r}: {error}") from error
    try:
        target = getattr(module, attribute)
    except AttributeError:
        raise RewardPluginError(f"module {module_name!r} has no attribute {attribute!r}") from None
    return _instantiate(target, None)


def _instantiate(target: Any, name: str | None) -> RewardPlugin:
    if isinstance(target, RewardPlugin):
        return target
    if inspect.isclass(target) and issubclass(target, RewardPlugin):
        plugin = target()
        if name and not target.name:
            target.name = name
        return plugin
    if callable(target):
        return FunctionReward(target, name)
    raise RewardPluginError(f"{target!r} is not a RewardPlugin subclass, instance or function")


def step_score_record(
    trajectory: Trajectory, score: Score, scorer: str, timestamp_ms: int, *, episode_score_count: int | None = None
) -> dict[str, Any]:
    """The ``StepScore`` record (topic ``scores``) for one score of one trajectory.

    ``timestamp_ms`` comes from the input (the trajectory record), so replays give identical records.
    ``episode_score_count`` is how many records the scorer publishes for this episode (StepScore v2; the same in
    each of them): the sample builder takes the scorer as done once that many have come. None leaves it unsaid.
    """
    step_versions = {step.call_index: step.policy_version for step in trajectory.steps}
    if score.call_index not in step_versions:
        raise RewardPluginError(
            f"scorer {scorer!r} scored call {score.call_index} of episode {trajectory.episode_id}, which has "
            f"calls {sorted(step_versions)}"
        )

    return {
        "run_id": trajectory.run_id,
        "episode_id": trajectory.episode_id,
        "call_index": score.call_index,
        "scorer": scorer,
        "policy_version": step_versions[score.call_index],
        "token_start": score.token_start,
        "token_end": score.token_end,
        "score": float(score.score),
        "details_json": json.dumps(dict(score.details), sort_keys=True),
        "episode_score_count": episode_score_count,
        "timestamp": timestamp_ms,
    }


def _snake_case(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
