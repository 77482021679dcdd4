"""``EngineConfig``: validated fields, and an import that does not pull in torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from orchard.engines.config import EngineConfig, PolicyUpdatesConfig


def test_defaults_and_nested_policy_updates() -> None:
    config = EngineConfig.model_validate({"model": "tiny-llama", "policy_updates": {"enabled": True}})
    assert (config.type, config.device, config.dtype, config.max_batch_size, config.max_queue) == (
        "local",
        "cpu",
        "auto",
        32,
        256,
    )
    assert config.policy_updates == PolicyUpdatesConfig(enabled=True)


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_batch_size", 0), ("max_queue", -1), ("device", "gpu"), ("dtype", "int8"), ("port", 70000), ("typo", 1)],
)
def test_bad_values_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as info:
        EngineConfig.model_validate({field: value})
    assert info.value.errors()[0]["loc"] == (field,)


def test_config_module_imports_without_torch() -> None:
    code = "import sys, orchard.engines.config; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
