"""A consumer's start position: what ``--start`` accepts, ``stage`` resolved from the run supervisor's variable, the
``runtime.start`` setting, and the runtime handing it to the bus."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest
from pydantic import ValidationError

from consumers import start as start_module
from consumers.config import RuntimeConfig
from consumers.reward_consumer import RewardConsumer
from consumers.rewards import FunctionReward
from consumers.runtime import ConsumerRuntime
from consumers.start import STAGE_STARTED_ENV, parse_start, resolve_start
from orchard.bus import open_bus
from orchard.config import EmbeddedBusConfig
from orchard.exceptions import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [("earliest", "earliest"), ("latest", "latest"), ("stage", "stage"), ("0", 0), ("1700000000000", 1700000000000),
     ("2023-11-14T22:13:20+00:00", 1700000000000), ("2023-11-15T00:13:20.250+02:00", 1700000000250)],
)  # fmt: skip
def test_start_options_name_a_position_or_a_time(text: str, expected: object) -> None:
    assert parse_start(text) == expected


@pytest.mark.parametrize("text", ["beginning", "-5", "2023-11-14T22:13:20", "12:00", ""])
def test_a_start_option_that_names_nothing_or_a_time_without_its_zone_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--start"):
        parse_start(text)


def test_stage_is_the_time_the_run_supervisor_passed() -> None:
    assert resolve_start("stage", {STAGE_STARTED_ENV: "1700000000000"}) == 1700000000000
    assert resolve_start(42, {}) == 42 and resolve_start("earliest", {STAGE_STARTED_ENV: "1"}) == "earliest"
    for environ in ({}, {STAGE_STARTED_ENV: "soon"}):
        with pytest.raises(ConfigError, match=STAGE_STARTED_ENV):
            resolve_start("stage", environ)


def test_the_runtime_setting_takes_a_position_stage_or_a_time_from_the_environment() -> None:
    assert RuntimeConfig().start == "earliest"
    assert RuntimeConfig(start="stage").start == "stage"
    assert RuntimeConfig.model_validate({"start": "1700000000000"}).start == 1700000000000  # as from an env var
    for bad in (-1, "soon"):
        with pytest.raises(ValidationError):
            RuntimeConfig(start=bad)  # type: ignore[arg-type]


def test_the_runtime_opens_its_group_at_its_start_position(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    opened: list[object] = []
    consumer = bus.consumer

    def spy(topics: list[str], group: str | None = None, **kwargs: object) -> object:
        opened.append((group, kwargs.get("start")))
        return consumer(topics, group, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(bus, "consumer", spy)
    runtime = ConsumerRuntime(bus, RewardConsumer(FunctionReward(lambda s, t: 1.0, name="one")), start=1234)
    runtime.run(idle_exit_s=0.3)
    assert ("reward-one", 1234) in opened


def test_the_doctests_hold() -> None:
    outcome = doctest.testmod(start_module)
    assert (outcome.failed, outcome.attempted > 0) == (0, True)
