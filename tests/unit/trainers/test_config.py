"""The trainer config: YAML plus --set overrides, errors naming the field, and the learning-rate schedule."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.exceptions import ConfigError
from trainers.config import CheckpointModelSource, PolicyTrainerConfig, ScheduleConfig, load_trainer_config
from trainers.model import lr_factor


def test_file_and_overrides_are_merged(tmp_path: Path) -> None:
    path = tmp_path / "trainer.yaml"
    path.write_text("model: {type: checkpoint, path: /models/qwen}\nlr: 2.0e-5\nloss: {kind: rl}\n")
    config = load_trainer_config(path, ["loss.clip_eps=0.1", "staleness.max_policy_lag=4", "max_steps=100"])
    assert config.model == CheckpointModelSource(path=Path("/models/qwen"))
    assert (config.lr, config.loss.kind, config.loss.clip_eps) == (2e-5, "rl", 0.1)
    assert (config.staleness.max_policy_lag, config.max_steps) == (4, 100)
    assert config.step_tokens == config.batch_tokens * config.grad_accum


def test_a_bad_value_is_named_in_the_error() -> None:
    with pytest.raises(ConfigError, match=r"loss\.clip_eps: Input should be less than 1"):
        load_trainer_config(None, ["loss.clip_eps=1.5"])
    with pytest.raises(ConfigError, match=r"staleness\.policy"):
        load_trainer_config(None, ["staleness.policy=ignore"])
    with pytest.raises(ConfigError, match="key.path=value"):
        load_trainer_config(None, ["lr"])


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ConfigError, match="learning_rate: Extra inputs are not permitted"):
        load_trainer_config(None, ["learning_rate=1"])


def test_compile_with_deepspeed_is_refused() -> None:
    with pytest.raises(ValueError, match="compile"):
        PolicyTrainerConfig(backend="deepspeed", compile=True)


def test_round_input_refuses_per_step_outputs_and_idle_times_by_name_and_takes_epochs_per_round() -> None:
    with pytest.raises(ConfigError, match="idle_exit_s, publish_every: not used with input: rounds"):
        load_trainer_config(None, ["input=rounds", "publish_every=4", "idle_exit_s=5"])
    assert load_trainer_config(None, ["input=rounds", "epochs=2"]).epochs == 2


def test_schedule_warms_up_then_decays_to_the_floor() -> None:
    cosine = lr_factor(ScheduleConfig(kind="cosine", warmup_steps=4, min_lr_ratio=0.1), max_steps=14)
    assert [round(cosine(s), 4) for s in (0, 3, 4, 9, 14, 20)] == [0.25, 1.0, 1.0, 0.55, 0.1, 0.1]
    linear = lr_factor(ScheduleConfig(kind="linear", total_steps=10), max_steps=None)
    assert [linear(s) for s in (0, 5, 10)] == [1.0, 0.5, 0.0]
    assert lr_factor(ScheduleConfig(), max_steps=None)(1000) == 1.0


def test_rows_default_to_the_micro_batch_budget_and_row_tokens_zero_is_refused_by_name() -> None:
    assert load_trainer_config(None, ["batch_tokens=2048"]).packed_row_tokens == 2048
    assert load_trainer_config(None, ["batch_tokens=2048", "row_tokens=1"]).packed_row_tokens == 1
    with pytest.raises(ConfigError, match="row_tokens"):
        load_trainer_config(None, ["row_tokens=0"])


def test_row_tokens_with_the_padded_layout_is_refused_by_name() -> None:
    assert load_trainer_config(None, ["layout=padded"]).layout == "padded"
    with pytest.raises(ConfigError, match="row_tokens"):
        load_trainer_config(None, ["layout=padded", "row_tokens=1"])
