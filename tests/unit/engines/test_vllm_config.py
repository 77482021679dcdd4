"""The vLLM backend's configuration: refused at start with the field named, and the ``vllm serve`` it launches."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from orchard.config import describe_validation_error
from orchard.engines.config import EngineConfig, VLLMConfig
from orchard.engines.vllm_backend import vllm_command, vllm_environment


def refusal(settings: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        EngineConfig.model_validate(settings)
    return describe_validation_error(info.value, "engine.yaml")


def test_vllm_defaults_launch_one_server_with_tool_parsing() -> None:
    config = EngineConfig.model_validate({"type": "vllm", "model": "/models/qwen"})
    assert config.vllm == VLLMConfig()
    assert (config.vllm.url, config.vllm.tool_call_parser, config.vllm.gpu_memory_utilization) == (None, "hermes", 0.85)


@pytest.mark.parametrize(
    ("settings", "field", "says"),
    [
        ({"type": "sglang"}, "type", "'local' or 'vllm'"),
        (
            {"type": "vllm", "vllm": {"gpu_memory_utilization": 1.5}},
            "vllm.gpu_memory_utilization",
            "less than or equal",
        ),
        ({"type": "vllm", "vllm": {"gpu_memory_utilization": 0}}, "vllm.gpu_memory_utilization", "greater than 0"),
        ({"type": "vllm", "vllm": {"url": "localhost:8000"}}, "vllm.url", "should match pattern"),
        ({"type": "vllm", "vllm": {"url": "http://h:8000/v1"}}, "vllm.url", "should match pattern"),
        ({"type": "vllm", "vllm": {"tensor_parallel_size": 0}}, "vllm.tensor_parallel_size", "greater than or equal"),
        ({"type": "vllm", "vllm": {"drain_timeout_s": 0}}, "vllm.drain_timeout_s", "greater than 0"),
        ({"type": "vllm", "vllm": {"gpus": 2}}, "vllm.gpus", "Extra inputs are not permitted"),
        ({"type": "vllm", "vllm": {"extra_args": ["--port=9"]}}, "vllm", "set by Orchard"),
        (
            {"type": "vllm", "vllm": {"url": "http://h:8000", "gpu_memory_utilization": 0.5}},
            "vllm",
            "gpu_memory_utilization: only apply when Orchard launches vLLM",
        ),
        ({"type": "local", "vllm": {"url": "http://h:8000"}}, "(root)", "type is 'local'"),
    ],
)
def test_bad_vllm_settings_are_refused_naming_the_field(settings: dict[str, Any], field: str, says: str) -> None:
    message = refusal(settings)
    assert f"  {field}: " in message
    assert says in message


def test_attaching_needs_only_a_url_and_keeps_request_timeouts() -> None:
    config = EngineConfig.model_validate(
        {"type": "vllm", "vllm": {"url": "http://gpu-node:8000", "request_timeout_s": 30, "drain_timeout_s": 5}}
    )
    assert (config.vllm.url, config.vllm.request_timeout_s, config.vllm.drain_timeout_s) == (
        "http://gpu-node:8000",
        30,
        5,
    )


def test_launch_command_carries_the_config_and_the_weight_loader_extension() -> None:
    config = EngineConfig.model_validate(
        {
            "type": "vllm",
            "model": "/models/qwen",
            "dtype": "bfloat16",
            "max_context": 4096,
            "vllm": {"gpu_memory_utilization": 0.6, "tensor_parallel_size": 2, "extra_args": ["--enforce-eager"]},
        }
    )
    assert vllm_command(config, "/models/qwen", 8123, "qwen") == [
        "vllm", "serve", "/models/qwen", "--host", "127.0.0.1", "--port", "8123",
        "--served-model-name", "qwen", "--dtype", "bfloat16",
        "--gpu-memory-utilization", "0.6", "--tensor-parallel-size", "2",
        "--worker-extension-cls", "orchard.engines.vllm_worker.OrchardWorkerExtension",
        "--generation-config", "vllm",
        "--max-model-len", "4096",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--enforce-eager",
    ]  # fmt: skip


def test_without_a_tool_parser_no_auto_tool_choice_is_enabled() -> None:
    config = EngineConfig.model_validate({"type": "vllm", "vllm": {"tool_call_parser": None}})
    command = vllm_command(config, "m", 1, "m")
    assert "--enable-auto-tool-choice" not in command and "--tool-call-parser" not in command


def test_launched_server_runs_in_dev_mode_for_weight_updates() -> None:
    assert vllm_environment({"PATH": "/bin"}) == {"PATH": "/bin", "VLLM_SERVER_DEV_MODE": "1"}
