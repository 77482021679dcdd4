"""The config every command loads: the core's sections plus the consumers' settings, validated by their own model."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.config import load_config
from orchard.exceptions import ConfigError
from orchard.run.settings import load_full_config


def test_consumer_settings_from_the_environment_are_parsed_by_the_consumers_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ORCHARD_CONSUMERS__SAMPLE_BUILDER__KINDS", '["SFT"]')
    monkeypatch.setenv("ORCHARD_CONSUMERS__SAMPLE_BUILDER__GROUP_SIZE", "2")
    monkeypatch.setenv("ORCHARD_CONSUMERS__RUNTIME__POLL_TIMEOUT_S", "0.25")
    config = load_full_config()
    builder = config.consumers.sample_builder
    assert (builder.kinds, builder.group_size, config.consumers.runtime.poll_timeout_s) == (["SFT"], 2, 0.25)


def test_a_bad_consumer_setting_fails_at_start_with_its_field_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHARD_CONSUMERS__SAMPLE_BUILDER__GROUP_SIZE", "0")
    with pytest.raises(ConfigError, match=r"consumers\.sample_builder\.group_size"):
        load_full_config()


def test_overrides_beat_the_environment_in_the_full_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHARD_CONSUMERS__SAMPLE_BUILDER__GROUP_SIZE", "2")
    config = load_full_config(run_id="cli", consumers={"sample_builder": {"group_size": 3}})
    assert (config.run_id, config.consumers.sample_builder.group_size) == ("cli", 3)


def test_the_core_loader_reads_a_file_with_a_consumers_section_as_plain_data(tmp_path: Path) -> None:
    path = tmp_path / "orchard.yaml"
    path.write_text("run_id: r1\nconsumers:\n  sample_builder:\n    group_size: 2\n")
    assert load_config(path).consumers == {"sample_builder": {"group_size": 2}}
    assert load_full_config(path).consumers.sample_builder.group_size == 2
