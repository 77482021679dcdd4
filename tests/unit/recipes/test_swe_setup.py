"""The SWE recipe's setup stage: tasks from the shipped suite, two demonstrations per train instance (the first
always fixing the bug), idempotent on the same options, refusing other options and an empty suite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from recipes.swe.build import BuildConfig
from recipes.swe.instance import load_suite
from recipes.swe.setup import SUITE, DemoConfig, demo_kind, setup


def test_setup_builds_both_splits_and_plans_every_train_demonstration(tmp_path: Path) -> None:
    tasks, demos = setup(tmp_path, SUITE, BuildConfig(python="python3"), DemoConfig(failing_fraction=0.5, python="py"))
    train = [i.instance_id for i in load_suite(SUITE, split="train")]
    assert sorted(p.name for p in (tasks / "train").iterdir()) == sorted(train)
    lines = [json.loads(line) for line in (demos / "demonstrations.jsonl").read_text().splitlines()]
    assert [(line["task_id"], line["episode_id"]) for line in lines[:2]] == [
        (train[0], f"expert-{train[0]}-builtin-0"),
        (train[0], f"expert-{train[0]}-builtin-1"),
    ]
    assert len(lines) == 2 * len(train) and {line["kind"] for line in lines[::2]} == {"fix"}
    assert 0 < sum(line["kind"] == "no-fix" for line in lines) < len(train)
    plan = yaml.safe_load((demos / "plans" / f"{lines[0]['episode_id']}.yaml").read_text())
    commands = [step["tool_calls"][0]["arguments"]["command"] for step in plan["steps"][:-1]]
    assert any(command.startswith("py -m pytest") for command in commands)  # the expert's interpreter


def test_setup_keeps_its_tasks_on_the_same_options_and_refuses_others(tmp_path: Path) -> None:
    setup(tmp_path, SUITE, BuildConfig(), DemoConfig())
    manifest = (tmp_path / "tasks" / "manifest.json").stat().st_mtime_ns
    setup(tmp_path, SUITE, BuildConfig(), DemoConfig(episodes_per_task=1))  # plans are rewritten, tasks kept
    assert (tmp_path / "tasks" / "manifest.json").stat().st_mtime_ns == manifest
    assert len((tmp_path / "demos" / "demonstrations.jsonl").read_text().splitlines()) == 25
    assert len(list((tmp_path / "demos" / "plans").iterdir())) == 25  # no plan of the earlier options lingers
    with pytest.raises(ValueError, match="built with other options"):
        setup(tmp_path, SUITE, BuildConfig(max_steps=3), DemoConfig())


def test_setup_refuses_a_suite_without_instances(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no instance directories"):
        setup(tmp_path / "run", tmp_path / "nowhere", BuildConfig(), DemoConfig())


def test_the_first_demonstration_always_fixes_and_the_choice_is_seeded() -> None:
    config = DemoConfig(failing_fraction=1.0)
    assert demo_kind("x", 0, config) == "fix" and demo_kind("x", 1, config) == "no-fix"
    kinds = [demo_kind(f"i{n}", 1, DemoConfig(failing_fraction=0.3, seed=7)) for n in range(200)]
    assert kinds == [demo_kind(f"i{n}", 1, DemoConfig(failing_fraction=0.3, seed=7)) for n in range(200)]
    assert 30 < kinds.count("no-fix") < 90
