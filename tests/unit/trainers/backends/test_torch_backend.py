"""The plain-torch training backend: a checkpoint restores exactly, and a later stage's learning rate wins."""

from __future__ import annotations

import pytest
import torch

from trainers.backends.torch_backend import TorchBackend
from trainers.config import PolicyTrainerConfig
from trainers.model import load_policy_model


def backend(**overrides: object) -> TorchBackend:
    config = PolicyTrainerConfig.model_validate({"model": {"type": "tiny", "name": "tiny-llama-micro"}, **overrides})
    return TorchBackend(load_policy_model(config.model), config, torch.device("cpu"))


def one_step(trained: TorchBackend) -> None:
    ids = torch.arange(8).unsqueeze(0)
    logits = trained.forward(ids, torch.arange(8).unsqueeze(0))
    trained.backward(logits.float().logsumexp(-1).mean())
    trained.step()


def test_a_checkpoint_with_the_same_learning_rate_restores_the_schedule_exactly() -> None:
    first = backend(lr=1e-3, schedule={"kind": "cosine", "warmup_steps": 2}, max_steps=10)
    for _ in range(3):
        one_step(first)
    again = backend(lr=1e-3, schedule={"kind": "cosine", "warmup_steps": 2}, max_steps=10)
    again.load_state_tensors(first.state_tensors())
    assert again.lr == first.lr
    assert again.optimizer.state_dict()["param_groups"] == first.optimizer.state_dict()["param_groups"]


def test_a_later_stage_keeps_the_step_and_moments_but_takes_its_own_peak_learning_rate() -> None:
    sft = backend(lr=1e-3, schedule={"kind": "constant", "warmup_steps": 1})
    for _ in range(3):
        one_step(sft)
    rl = backend(lr=2e-4, schedule={"kind": "constant", "warmup_steps": 1})
    rl.load_state_tensors(sft.state_tensors())
    assert rl.lr == pytest.approx(2e-4)
    assert rl.scheduler.last_epoch == sft.scheduler.last_epoch == 3
    assert all(group["lr"] == pytest.approx(2e-4) for group in rl.optimizer.param_groups)
    moments = next(iter(rl.optimizer.state.values()))
    assert moments["step"] == 3  # AdamW's moments came along
    one_step(rl)
    assert rl.lr == pytest.approx(2e-4)
