"""Process reward models: a score for each step of an agent's attempt, for what the step did rather than the outcome.

**``RuleProcessReward``** (``rule_process_reward``): rules over what each step did, read from its tool calls and the
results later requests carry (``consumers.actions``: shell commands of the built-in agent's ``shell`` tool, Codex
argv commands, editor tools, fenced commands of text harnesses). Steps are judged in call order; the weights are
``RuleSettings`` (environment ``ORCHARD_RULE_PRM_*``):

==============  =====  ==========================================================================================
rule            score  when
==============  =====  ==========================================================================================
``write_test``  +0.5   the step writes a test file or a reproduction script (``consumers.actions.is_test_path``)
``run_tests``   +0.25  it runs a test command, with no source edit since the last test run (reproducing, checking)
``verify_fix``  +1.0   it runs a test command after a source edit (in an earlier step, or earlier in this step)
``fix_passes``  +0.5   extra, when that verifying run's result shows exit code 0 and no error in its output
``repeat``      -0.5   the step's actions are identical to an earlier step's with no edit in between (a loop);
                       replaces every other rule of the step
``no_op``       -0.25  the step does nothing: no action, or only malformed/unknown calls (the last step of a
                       trajectory, the final answer, is exempt)
==============  =====  ==========================================================================================

A step's score is the sum of its rules, each counted once per step (0.0 when none applies; every step is scored);
``details["rules"]`` lists them. Re-running the same test command *after* an edit is not a repeat: the edit between
makes it a verification.

**``EngineProcessReward``** (``process_reward``): a judge model served by an engine. The judge's prompt
(``JudgeSettings.prompt``) shows the step's recent context and its action; the engine scores the two continuations
``prompt + " good"`` and ``prompt + " bad"`` (one ``/v1/completions`` echo request, as in distillation), and

    p_good = sigmoid(log P(" good" | prompt) - log P(" bad" | prompt)),   score = 2 * p_good - 1   (in [-1, 1])

Reading the verdict's logprob rather than parsing a generated answer gives a calibrated, deterministic score from
any model (a verdict of several tokens included) and never fails to parse; it works on vLLM and the local engine
alike. On the tiny test model the verdicts are meaningless, but the path is the same.

>>> RuleProcessReward().scorer_name
'rule_process_reward'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from consumers.actions import Action, is_test_path, trajectory_actions
from consumers.dense.engine_client import EngineClient, score_steps_concurrently, where
from consumers.dense.exceptions import EngineAnswerError
from consumers.dense.settings import JudgeSettings, RuleSettings, load_settings
from consumers.rewards import RewardPlugin, Score, StepResult
from orchard.trajectory import Step, Trajectory


# ---------------------------------------------------------------------------------------------------- rules
@dataclass
class _RuleState:
    """What the steps so far did: an unverified source edit, and each action signature's edit epoch."""

    pending_edit: bool = False
    epoch: int = 0
    seen: dict[tuple[str, ...], int] = field(default_factory=dict)


class RuleProcessReward(RewardPlugin):
    """Rule-based process reward; see the module docstring for the rules and weights."""

    name = "rule_process_reward"

    def __init__(self, settings: RuleSettings | None = None, **overrides: Any) -> None:
        """From ``settings``, or the environment (``ORCHARD_RULE_PRM_*``) with ``overrides`` winning."""
        self.settings = settings or load_settings(RuleSettings, overrides)

    def score_episode(self, trajectory: Trajectory) -> list[Score]:
        """Every step, in call order (rules depend on the steps before)."""
        steps = trajectory.steps
        state = _RuleState()
        scores = []
        for position, (step, actions) in enumerate(zip(steps, trajectory_actions(steps), strict=True)):
            rules = self._rules(actions, state, last=position == len(steps) - 1)
            total = sum(getattr(self.settings, rule) for rule in rules)
            scores.append(Score(step.call_index, float(total), details={"rules": rules}))
        return scores

    def score_step(self, step: Step, trajectory: Trajectory) -> StepResult:
        """The step's score within its trajectory (the rules need the steps before it)."""
        return next(s for s in self.score_episode(trajectory) if s.call_index == step.call_index)

    def _rules(self, actions: Sequence[Action], state: _RuleState, last: bool) -> list[str]:
        valid = [action for action in actions if not action.invalid and action.command != ""]
        if not valid:
            return [] if last else ["no_op"]
        signature = tuple(action.key for action in valid)
        repeated = state.seen.get(signature) == state.epoch
        state.seen[signature] = state.epoch
        rules: list[str] = []
        for action in valid:
            rules += self._action_rules(action, state)
        if any(action.edited for action in valid):
            state.epoch += 1
        return ["repeat"] if repeated else list(dict.fromkeys(rules))

    @staticmethod
    def _action_rules(action: Action, state: _RuleState) -> list[str]:
        rules = []
        if any(is_test_path(path) for path in action.edited):
            rules.append("write_test")
        if any(not is_test_path(path) for path in action.edited):
            state.pending_edit = True
        if action.runs_tests:
            if state.pending_edit:
                rules.append("verify_fix")
                if action.exit_code == 0 and not action.error_output:
                    rules.append("fix_passes")
            else:
                rules.append("run_tests")
            state.pending_edit = False
        return rules


# ---------------------------------------------------------------------------------------------------- judge
class EngineProcessReward(RewardPlugin):
    """A judge model's verdict logprobs; see the module docstring."""

    name = "process_reward"

    def __init__(self, settings: JudgeSettings | None = None, **overrides: Any) -> None:
        """From ``settings``, or the environment (``ORCHARD_PRM_*``) with ``overrides`` winning."""
        self.settings = settings or load_settings(JudgeSettings, overrides)
        self.judge = EngineClient(self.settings.judge_url, self.settings.judge_model, self.settings)

    def close(self) -> None:
        """Close the connections to the judge."""
        self.judge.close()

    def score_episode(self, trajectory: Trajectory) -> list[Score]:
        """Every step, ``concurrency`` judge requests at a time."""
        return score_steps_concurrently(self.score_step, trajectory, self.settings.concurrency)

    def score_step(self, step: Step, trajectory: Trajectory) -> StepResult:
        """``2 * p_good - 1`` for the step."""
        at = where(trajectory, step)
        prompt = self.judge_prompt(step)
        good, bad = self.judge.echo([prompt + self.settings.good_verdict, prompt + self.settings.bad_verdict], at)
        if good.token_ids is None or bad.token_ids is None:
            raise EngineAnswerError(f"{at}: the judge at {self.judge.base_url} did not return tokens as token ids")
        shared = _common_prefix(good.token_ids, bad.token_ids)
        margin = _sum(good.logprobs[shared:]) - _sum(bad.logprobs[shared:])
        p_good = 1.0 / (1.0 + math.exp(-max(min(margin, 50.0), -50.0)))
        return Score(step.call_index, 2.0 * p_good - 1.0, details={"p_good": p_good, "judge_model": self.judge.model})

    def judge_prompt(self, step: Step) -> str:
        """The judge's prompt for ``step``: its recent messages and its action put into the template."""
        context = "\n".join(_message_text(m) for m in step.request_messages if _role(m) != "system")
        context = context[-self.settings.max_context_chars :] if self.settings.max_context_chars else ""
        action = "\n".join([step.response_text, *(_call_text(call) for call in step.response_tool_calls)]).strip()
        action = _middle_cut(action, self.settings.max_action_chars)
        return self.settings.prompt.replace("{context}", context).replace("{action}", action)


def _role(message: Any) -> str:
    return str(message.get("role", "")) if isinstance(message, Mapping) else ""


def _message_text(message: Any) -> str:
    if not isinstance(message, Mapping):
        return str(message)
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    calls = [_call_text(call) for call in message.get("tool_calls") or ()]
    return "\n".join([f"{_role(message)}: {content or ''}", *calls])


def _call_text(call: Any) -> str:
    function = call.get("function") or call if isinstance(call, Mapping) else {}
    return f"call {function.get('name', '?')}({function.get('arguments', '')})"


def _middle_cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[...]\n{text[len(text) - (limit - half) :]}"


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


def _sum(logprobs: Sequence[float | None]) -> float:
    return float(sum(value for value in logprobs if value is not None))
