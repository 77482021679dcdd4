"""The DeepSpeed backend's guard: without the package, a clear error that says how to install it."""

from __future__ import annotations

import pytest
import torch

from trainers.backends.deepspeed_backend import DeepSpeedBackend, deepspeed_available, deepspeed_config
from trainers.config import PolicyTrainerConfig
from trainers.exceptions import BackendUnavailableError


@pytest.mark.skipif(deepspeed_available(), reason="checks the error raised when deepspeed is not installed")
def test_missing_deepspeed_raises_a_clear_error() -> None:
    with pytest.raises(BackendUnavailableError, match=r"pip install 'orchard-rl\[deepspeed\]'"):
        DeepSpeedBackend(torch.nn.Linear(2, 2), PolicyTrainerConfig(backend="deepspeed"), torch.device("cpu"))  # type: ignore[arg-type]


def test_trainer_settings_map_to_the_deepspeed_config() -> None:
    config = PolicyTrainerConfig(
        lr=3e-5,
        grad_clip=0.5,
        precision="bf16",
        backend={"type": "deepspeed", "config": {"zero_optimization": {"stage": 3}}},
    )
    mapped = deepspeed_config(config, torch.device("cpu"))
    assert mapped["optimizer"]["params"]["lr"] == 3e-5
    assert (mapped["gradient_clipping"], mapped["bf16"], mapped["zero_optimization"]) == (
        0.5,
        {"enabled": True},
        {"stage": 3},
    )
