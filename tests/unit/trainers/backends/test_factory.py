"""The trainer backend seam: the ``backend`` union keyed by ``type`` (with the name alone and the top-level
``deepspeed_config`` of files written before it), and ``open_backend`` giving the backend the config names."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from orchard.exceptions import ConfigError
from trainers.backends.deepspeed_backend import deepspeed_available
from trainers.backends.factory import open_backend
from trainers.backends.torch_backend import TorchBackend
from trainers.config import DeepSpeedBackendConfig, PolicyTrainerConfig, TorchBackendConfig, load_trainer_config
from trainers.exceptions import BackendUnavailableError
from trainers.model import load_policy_model

ZERO_3 = {"zero_optimization": {"stage": 3}}


def test_the_default_backend_is_torch() -> None:
    assert PolicyTrainerConfig().backend == TorchBackendConfig()
    assert load_trainer_config(None, ["backend={}"]).backend == TorchBackendConfig()


def test_the_name_alone_is_short_for_the_type(tmp_path: Path) -> None:
    path = tmp_path / "trainer.yaml"
    path.write_text("backend: deepspeed\n")
    assert load_trainer_config(path).backend == DeepSpeedBackendConfig()
    assert load_trainer_config(path, ["backend=torch"]).backend == TorchBackendConfig()
    assert PolicyTrainerConfig(backend="deepspeed").backend == DeepSpeedBackendConfig()  # type: ignore[arg-type]


def test_the_mapping_form_carries_the_deepspeed_options(tmp_path: Path) -> None:
    path = tmp_path / "trainer.yaml"
    path.write_text("backend:\n  type: deepspeed\n  config:\n    zero_optimization: {stage: 3}\n")
    assert load_trainer_config(path).backend == DeepSpeedBackendConfig(config=ZERO_3)
    staged = load_trainer_config(path, ["backend.config.zero_optimization.stage=2"]).backend
    assert staged == DeepSpeedBackendConfig(config={"zero_optimization": {"stage": 2}})


def test_a_top_level_deepspeed_config_is_the_deepspeed_backends_options(tmp_path: Path) -> None:
    path = tmp_path / "trainer.yaml"
    path.write_text("backend: deepspeed\ndeepspeed_config:\n  zero_optimization: {stage: 3}\n")
    assert load_trainer_config(path).backend == DeepSpeedBackendConfig(config=ZERO_3)
    overridden = ["backend=deepspeed", "deepspeed_config={zero_optimization: {stage: 2, offload_optimizer: {}}}"]
    assert load_trainer_config(None, overridden).backend.config == {  # type: ignore[union-attr]
        "zero_optimization": {"stage": 2, "offload_optimizer": {}}
    }
    # as before the union, a torch backend ignores it: one file runs on DeepSpeed or, with backend=torch, on one device
    assert load_trainer_config(path, ["backend=torch"]).backend == TorchBackendConfig()
    assert "deepspeed_config" not in PolicyTrainerConfig(backend="deepspeed").model_dump()  # type: ignore[arg-type]


def test_bad_backend_settings_fail_at_load_with_the_field_named() -> None:
    with pytest.raises(ConfigError, match=r"backend: Input tag 'jax' found using 'type' does not match"):
        load_trainer_config(None, ["backend=jax"])
    with pytest.raises(ConfigError, match=r"backend\.torch\.config: Extra inputs are not permitted"):
        load_trainer_config(None, ["backend={type: torch, config: {}}"])
    with pytest.raises(ConfigError, match=r"backend: 'type' is missing: config is a setting of type 'deepspeed'") as no:
        load_trainer_config(None, ["backend.config={}"])
    assert "ORCHARD_" not in str(no.value)  # the trainer's config is a file and --set, not the environment
    with pytest.raises(ConfigError, match=r"deepspeed_config: DeepSpeed's options are given twice"):
        load_trainer_config(None, ["backend={type: deepspeed, config: {}}", "deepspeed_config={}"])
    with pytest.raises(ConfigError, match=r"deepspeed_config: must be a mapping"):
        load_trainer_config(None, ["deepspeed_config=3"])


def test_compile_with_deepspeed_is_refused_in_either_form() -> None:
    for backend in ("deepspeed", {"type": "deepspeed", "config": ZERO_3}):
        with pytest.raises(ValueError, match="compile: torch.compile is configured through backend.config"):
            PolicyTrainerConfig(backend=backend, compile=True)  # type: ignore[arg-type]
    assert PolicyTrainerConfig(backend="torch", compile=True).compile  # type: ignore[arg-type]


def test_open_backend_gives_the_backend_the_config_names() -> None:
    tiny = {"type": "tiny", "name": "tiny-llama-micro"}
    config = PolicyTrainerConfig.model_validate({"model": tiny})
    opened = open_backend(load_policy_model(config.model), config, torch.device("cpu"))
    assert isinstance(opened, TorchBackend)
    deepspeed = PolicyTrainerConfig.model_validate({"model": tiny, "backend": "deepspeed"})
    if not deepspeed_available():
        with pytest.raises(BackendUnavailableError, match=r"pip install 'orchard-rl\[deepspeed\]'"):
            open_backend(load_policy_model(config.model), deepspeed, torch.device("cpu"))


def test_a_top_level_deepspeed_config_reaches_a_deepspeed_backend_built_in_python() -> None:
    config = PolicyTrainerConfig(backend=DeepSpeedBackendConfig(), deepspeed_config={"zero_optimization": {"stage": 2}})
    assert config.backend == DeepSpeedBackendConfig(config={"zero_optimization": {"stage": 2}})
    with pytest.raises(ValidationError, match=r"deepspeed_config: DeepSpeed's options are given twice"):
        PolicyTrainerConfig(backend=DeepSpeedBackendConfig(config={}), deepspeed_config={})
