"""Trainers' consumer groups and static instance ids (Kafka's group.instance.id) come from the run and the model, so
two pipelines or two trainers never share one; explicit settings win."""

from __future__ import annotations

import pytest

from trainers.config import PolicyTrainerConfig, load_trainer_config


def test_groups_differ_between_runs_and_models_and_match_for_stages_of_one_model() -> None:
    policy, coder = PolicyTrainerConfig(), PolicyTrainerConfig(model_name="coder")
    groups = [policy.consumer_group("run-a"), policy.consumer_group("run-b"), coder.consumer_group("run-a")]
    assert groups == ["run-a.policy-trainer.policy", "run-b.policy-trainer.policy", "run-a.policy-trainer.coder"]
    later_stage = load_trainer_config(None, ["loss.kind=rl", "stage_optimizer=fresh"])
    assert later_stage.consumer_group("run-a") == policy.consumer_group("run-a")


def test_instance_ids_are_per_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    config = PolicyTrainerConfig(model_name="m")
    monkeypatch.delenv("RANK", raising=False)
    alone = config.static_instance_id("r")
    monkeypatch.setenv("RANK", "5")
    assert (alone, config.static_instance_id("r")) == ("r.policy-trainer.m.0", "r.policy-trainer.m.5")


def test_explicit_group_and_instance_id_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    grouped = load_trainer_config(None, ["group_id=shared-trainer"])
    pinned = load_trainer_config(None, ["group_id=shared-trainer", "instance_id=trainer-0"])
    assert (grouped.consumer_group("r"), grouped.static_instance_id("r")) == ("shared-trainer", "shared-trainer.0")
    assert (pinned.consumer_group("r"), pinned.static_instance_id("r")) == ("shared-trainer", "trainer-0")


def test_model_names_are_made_safe_for_group_names() -> None:
    assert PolicyTrainerConfig(model_name="org/Model 7B").consumer_group("r") == "r.policy-trainer.org-Model-7B"


def test_value_trainer_groups_come_from_the_run_and_model_unless_set() -> None:
    from trainers.value_trainer import ValueTrainerConfig

    derived = ValueTrainerConfig(run_id="r9", name="critic").consumer_group()
    assert (derived, ValueTrainerConfig(group="mine").consumer_group()) == ("r9.value-trainer.critic", "mine")
