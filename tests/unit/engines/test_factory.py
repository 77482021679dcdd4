"""``open_engine``: each ``type`` gives its backend, behind the ``Engine`` interface; a bad config is refused, named."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import TypeAdapter, ValidationError

from orchard.config import describe_validation_error
from orchard.engines.base import Engine
from orchard.engines.config import AnyEngineConfig, EngineConfig, ScriptedEngineConfig
from orchard.engines.exceptions import EngineError
from orchard.engines.factory import open_engine
from orchard.engines.local import LocalEngine
from orchard.engines.scripted_engine import ScriptedEngine
from orchard.engines.vllm_backend import VLLMBackend

ENGINE_CONFIG: TypeAdapter[Any] = TypeAdapter(AnyEngineConfig)


def refusal(settings: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        ENGINE_CONFIG.validate_python(settings)
    return describe_validation_error(info.value, "engine.yaml")


def test_local_builds_the_tiny_checkpoint_and_serves_it(tmp_path: Path) -> None:
    config = ENGINE_CONFIG.validate_python({"model": "tiny-llama-micro", "cache_dir": str(tmp_path)})
    engine = open_engine(config)
    try:
        assert isinstance(engine, LocalEngine)
        assert (config.type, engine.model_name, engine.policy_version) == ("local", "tiny-llama-micro", 0)
        assert {route.path for route in engine.create_app().routes} >= {"/v1/chat/completions", "/healthz"}
    finally:
        engine.close()


def test_vllm_with_a_url_attaches_without_launching() -> None:
    config = ENGINE_CONFIG.validate_python(
        {"type": "vllm", "model": "qwen", "served_model_name": "policy", "vllm": {"url": "http://127.0.0.1:9"}}
    )
    engine = open_engine(config)
    assert isinstance(engine, VLLMBackend)
    assert (engine.model_name, engine.policy_version, engine.server, str(engine.client.base_url)) == (
        "policy",
        0,
        None,
        "http://127.0.0.1:9",
    )
    engine.close()
    asyncio.run(engine.client.aclose())


def test_scripted_replays_its_plan_and_has_no_weights(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"model": "scripted-m", "steps": [{"text": "hi"}]}))
    engine = open_engine(ENGINE_CONFIG.validate_python({"type": "scripted", "plan": str(plan), "policy_version": 4}))
    assert isinstance(engine, ScriptedEngine)
    assert (engine.model_name, engine.policy_version) == ("scripted-m", 4)
    assert {route.path for route in engine.create_app().routes} >= {"/v1/chat/completions", "/v1/models"}
    with pytest.raises(EngineError, match="no weights"):
        engine.load_version(tmp_path, 5)
    engine.close()


def test_a_scripted_plan_that_does_not_load_is_named(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("steps: [{texts: hi}]\n")
    with pytest.raises(ValueError, match=f"cannot load scripted plan {plan}"):
        open_engine(ScriptedEngineConfig(plan=plan))


def test_every_backend_is_an_engine() -> None:
    assert all(issubclass(backend, Engine) for backend in (LocalEngine, VLLMBackend, ScriptedEngine))


def test_settings_without_a_type_are_the_local_engine() -> None:
    assert ENGINE_CONFIG.validate_python({"model": "tiny-llama"}) == EngineConfig(model="tiny-llama")


def test_an_unknown_type_is_refused_naming_the_field_and_the_types() -> None:
    message = refusal({"type": "sglang"})
    assert "found using 'type'" in message
    assert "'local', 'vllm', 'scripted'" in message


def test_a_scripted_setting_without_its_type_says_which_type_to_set() -> None:
    message = refusal({"plan": "plan.yaml"})
    assert "set type: scripted" in message
    assert "allowed types: 'local' (the default), 'vllm', 'scripted'" in message


def test_a_bad_scripted_field_is_named() -> None:
    assert "  scripted.port: " in refusal({"type": "scripted", "plan": "p.yaml", "port": -1})
