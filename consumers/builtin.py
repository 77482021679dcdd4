"""What ``orchard consumer run NAME`` can run: Orchard's own processors by name, and any reward plug-in.

``NAME`` is a built-in processor (``assembler``, ``sample-builder``), a registered reward plug-in name, or a
``package.module:attribute`` path to a ``RewardPlugin`` class, instance or plain scoring function (run as a
``RewardConsumer``) or to a ``Processor`` subclass or instance (run as is).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from consumers.config import ConsumersConfig
from consumers.processor import Processor
from consumers.rewards import RewardPluginError, load_reward, registered_rewards
from orchard.exceptions import OrchardError


class UnknownConsumerError(OrchardError):
    """No built-in processor, registered reward or importable object has that name."""


def _assembler(config: ConsumersConfig) -> Processor:
    from consumers.assembler import TrajectoryAssembler

    return TrajectoryAssembler(config.assembler)


def _sample_builder(config: ConsumersConfig) -> Processor:
    from consumers.samples import SampleBuilder  # type: ignore[attr-defined]  # written alongside this module

    builder: Processor = SampleBuilder(config.sample_builder)
    return builder


BUILTIN: dict[str, Callable[[ConsumersConfig], Processor]] = {
    "assembler": _assembler,
    "sample-builder": _sample_builder,
}
"""Orchard's own processors, by the name ``orchard consumer run`` takes."""

BUILTIN_DESCRIPTIONS: dict[str, str] = {
    "assembler": "joins model-calls and outcomes into one Trajectory per episode (topic trajectories)",
    "sample-builder": "turns trajectories and scores into TrainingSamples (topic samples)",
}

PLUGIN_PACKAGES = ("consumers.dense",)
"""Packages imported before looking a reward name up, so their ``@register_reward`` decorators have run."""


def load_plugin_packages() -> None:
    """Import the packages that register Orchard's built-in reward plug-ins (missing ones are skipped)."""
    for package in PLUGIN_PACKAGES:
        try:
            importlib.import_module(package)
        except ImportError:
            continue


def available() -> dict[str, str]:
    """Every runnable name with a one-line description: built-ins, then registered reward plug-ins."""
    load_plugin_packages()
    names = dict(BUILTIN_DESCRIPTIONS)
    names.update({name: "reward plug-in (scores on topic scores)" for name in registered_rewards()})
    return names


def build_processor(spec: str, config: ConsumersConfig | None = None) -> Processor:
    """The processor ``spec`` names (see the module docstring)."""
    config = config or ConsumersConfig()
    if spec in BUILTIN:
        return BUILTIN[spec](config)
    if ":" in spec:
        target = _import(spec)
        if isinstance(target, Processor):
            return target
        if inspect.isclass(target) and issubclass(target, Processor):
            return target()
    load_plugin_packages()
    from consumers.reward_consumer import RewardConsumer

    try:
        return RewardConsumer(load_reward(spec), config=config.rewards, sample_builder=config.sample_builder)
    except RewardPluginError as exc:
        known = ", ".join(sorted(available()))
        raise UnknownConsumerError(f"cannot run consumer {spec!r}: {exc} (runnable names: {known})") from exc


def _import(spec: str) -> object:
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownConsumerError(f"cannot import module {module_name!r} of consumer {spec!r}: {exc}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise UnknownConsumerError(f"module {module_name!r} has no attribute {attribute!r}") from None
