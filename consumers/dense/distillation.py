"""On-policy distillation: a teacher's logprobs of the tokens the student sampled, as a per-token reverse-KL signal.

For each step, the whole sequence (prompt + completion token ids, exactly as the student's engine saw and sampled
them) is sent to the teacher engine's ``/v1/completions`` with ``echo`` and ``logprobs: 0``; the teacher's logprob
of completion token ``t`` is read at position ``len(prompt) + t``. The per-token signal is

    kl[t] = student_logprob[t] - teacher_logprob[t]

the single-sample estimate of the reverse KL(student || teacher) at that token, taken at the student's own sample
(on-policy). A trainer minimises it, i.e. uses ``-kl[t]`` as a per-token advantage.

What is emitted (``DistillationSettings.emit``):

- ``step`` (default): one ``Score`` per call, ``score = -mean(kl)`` (higher is closer to the teacher) and
  ``details = {"per_token": [kl[0], ...], "teacher_model": ...}``, one value per completion token. One record per
  call keeps the scores topic small; the sample builder reads ``per_token`` into per-token advantages.
- ``tokens``: one ``Score`` per completion token with ``token_start = t, token_end = t + 1`` and ``score = -kl[t]``,
  exact spans for consumers that only read spans, at the cost of one record per token.

The teacher must use the student's tokenizer (the ids are sent as they are). A step without completion tokens, or
re-tokenized from text (imported data: no sampling logprobs), is not scored. A teacher that is unreachable, refuses
the request, or scores another number of tokens than were sent raises a ``DenseRewardError`` naming the episode
and call, which the runtime dead-letters.

>>> OnPolicyDistillation(teacher_url="http://127.0.0.1:8000", teacher_model="teacher").scorer_name
'distillation'
"""

from __future__ import annotations

from typing import Any

import numpy as np

from consumers.dense.engine_client import EngineClient, score_steps_concurrently, where
from consumers.dense.exceptions import StepDataError, TokenMismatchError
from consumers.dense.settings import DistillationSettings, load_settings
from consumers.rewards import RewardPlugin, Score, StepResult
from orchard.trajectory import Step, Trajectory


class OnPolicyDistillation(RewardPlugin):
    """Per-token reverse KL to a teacher engine; see the module docstring."""

    name = "distillation"

    def __init__(self, settings: DistillationSettings | None = None, **overrides: Any) -> None:
        """From ``settings``, or the environment (``ORCHARD_DISTILLATION_*``) with ``overrides`` winning."""
        self.settings = settings or load_settings(DistillationSettings, overrides)
        self.teacher = EngineClient(self.settings.teacher_url, self.settings.teacher_model, self.settings)

    def close(self) -> None:
        """Close the connections to the teacher."""
        self.teacher.close()

    def score_episode(self, trajectory: Trajectory) -> list[Score]:
        """Every step, ``concurrency`` teacher requests at a time."""
        return score_steps_concurrently(self.score_step, trajectory, self.settings.concurrency)

    def score_step(self, step: Step, trajectory: Trajectory) -> StepResult:
        """The reverse-KL score(s) of one step; None for a step without sampled tokens."""
        if len(step.completion_token_ids) == 0 or step.retokenized:
            return None
        per_token = self.reverse_kl(step, trajectory)
        if self.settings.emit == "tokens":
            return [Score(step.call_index, -kl, token_start=t, token_end=t + 1) for t, kl in enumerate(per_token)]
        details = {"per_token": per_token, "teacher_model": self.settings.teacher_model}
        return Score(step.call_index, -float(np.mean(per_token)), details=details)

    def reverse_kl(self, step: Step, trajectory: Trajectory) -> list[float]:
        """``student - teacher`` logprob of each completion token of ``step``."""
        at = where(trajectory, step)
        student = step.completion_logprobs.astype(np.float64)
        if len(student) != len(step.completion_token_ids):
            raise StepDataError(
                f"{at}: {len(student)} student logprobs for {len(step.completion_token_ids)} completion tokens"
            )
        sequence = step.sequence.tolist()
        [echoed] = self.teacher.echo([sequence], at)
        if len(echoed.logprobs) != len(sequence) or (echoed.token_ids is not None and echoed.token_ids != sequence):
            raise TokenMismatchError(
                f"{at}: sent {len(sequence)} tokens to the teacher at {self.teacher.base_url}, it scored "
                f"{len(echoed.logprobs)}{'' if echoed.token_ids in (None, sequence) else ' other token ids'}"
            )
        completion = echoed.logprobs[len(step.prompt_token_ids) :]
        if None in completion:
            raise StepDataError(f"{at}: the first completion token has no teacher logprob (the prompt is empty)")
        teacher = np.array(completion, dtype=np.float64)
        return (student - teacher).tolist()
