"""Settings of the dense-reward plug-ins, read from the environment (``load_reward`` builds plug-ins with no
arguments) or given as keyword arguments (which win over the environment).

=====================================  =========================================================================
plug-in                                environment prefix
=====================================  =========================================================================
``distillation``                       ``ORCHARD_DISTILLATION_`` (e.g. ``ORCHARD_DISTILLATION_TEACHER_URL``)
``process_reward`` (engine judge)      ``ORCHARD_PRM_`` (e.g. ``ORCHARD_PRM_JUDGE_URL``)
``rule_process_reward``                ``ORCHARD_RULE_PRM_`` (e.g. ``ORCHARD_RULE_PRM_VERIFY_FIX``)
=====================================  =========================================================================

The API key is a ``SecretStr`` and belongs in the environment only.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from orchard.exceptions import ConfigError

DEFAULT_JUDGE_PROMPT = """You review one step of a software agent fixing a bug in a repository.
Good steps make progress: they reproduce the bug, write a test, edit the code the fix needs, or run the tests to
verify a fix. Bad steps repeat themselves, do nothing, or break things.

Recent context:
{context}

The agent's step:
{action}

Verdict (good or bad):"""


class EngineSettings(BaseSettings):
    """How a plug-in reaches an OpenAI-compatible engine (the local engine or vLLM)."""

    model_config = SettingsConfigDict(extra="forbid")

    timeout_s: float = Field(120.0, gt=0, description="Timeout of one HTTP request to the engine.")
    concurrency: int = Field(4, ge=1, le=256, description="Steps of one trajectory scored at once (parallel requests).")
    max_retries: int = Field(2, ge=0, le=10, description="Retries of a request refused with 503/429 or unreachable.")
    echo_max_tokens: int = Field(
        1,
        ge=0,
        le=1,
        description="max_tokens of the scoring request. The local engine accepts 0; vLLM refuses 0 (it always "
        "generates), so 1 works against both: the generated token is ignored.",
    )
    api_key: SecretStr | None = Field(None, description="Bearer token of the engine (environment only).")


class DistillationSettings(EngineSettings):
    """On-policy distillation: the teacher engine, which must share the student's tokenizer."""

    model_config = SettingsConfigDict(env_prefix="ORCHARD_DISTILLATION_", extra="forbid")

    teacher_url: str = Field(min_length=1, description="Base URL of the teacher engine (with or without /v1).")
    teacher_model: str = Field(min_length=1, description="Model name the teacher engine serves.")
    emit: Literal["step", "tokens"] = Field(
        "step",
        description="'step': one Score per call, score = -mean reverse KL, per-token values in details['per_token']; "
        "'tokens': one Score per completion token (token_start..token_end of length 1), score = -reverse KL.",
    )


class JudgeSettings(EngineSettings):
    """The engine-backed process reward model: a judge engine and the prompt it is asked."""

    model_config = SettingsConfigDict(env_prefix="ORCHARD_PRM_", extra="forbid")

    judge_url: str = Field(min_length=1, description="Base URL of the judge engine (with or without /v1).")
    judge_model: str = Field(min_length=1, description="Model name the judge engine serves.")
    prompt: str = Field(
        DEFAULT_JUDGE_PROMPT,
        min_length=1,
        description="The judge's prompt (raw text, no chat template: write the model's own markup into it for an "
        "instruct model); {context} and {action} are replaced by the step's context and action.",
    )
    good_verdict: str = Field(" good", min_length=1, description="Text appended for the 'good' verdict.")
    bad_verdict: str = Field(" bad", min_length=1, description="Text appended for the 'bad' verdict.")
    max_context_chars: int = Field(4000, ge=0, description="Characters of recent messages shown (the latest kept).")
    max_action_chars: int = Field(4000, ge=1, description="Characters of the step's action shown (middle cut).")


class RuleSettings(BaseSettings):
    """Weights of the rule-based process reward (see ``consumers.dense.process_reward``)."""

    model_config = SettingsConfigDict(env_prefix="ORCHARD_RULE_PRM_", extra="forbid")

    write_test: float = Field(0.5, description="A step that writes a test file (or a reproduction script).")
    run_tests: float = Field(0.25, description="A step that runs the tests with no source edit since the last run.")
    verify_fix: float = Field(1.0, description="A step that runs the tests after a source edit (verifying a fix).")
    fix_passes: float = Field(0.5, description="Extra when that verifying run exits 0 without errors in its output.")
    repeat: float = Field(-0.5, description="A step identical to an earlier one with no edit between (replaces all).")
    no_op: float = Field(-0.25, description="A step that does nothing (no action, or only malformed calls).")


SettingsT = TypeVar("SettingsT", bound=BaseSettings)


def load_settings(cls: type[SettingsT], overrides: dict[str, Any]) -> SettingsT:
    """``cls`` from the environment and ``overrides``; ``ConfigError`` naming each bad field and its variable."""
    try:
        return cls(**overrides)
    except ValidationError as exc:
        prefix = str(cls.model_config.get("env_prefix", ""))
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))} (env {prefix}{str(e['loc'][0]).upper()}): {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"invalid {cls.__name__}: {problems}") from exc
