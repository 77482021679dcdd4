"""The vLLM worker extension on the CPU, with a stand-in for vLLM's model (its ``load_weights`` takes an iterator)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from orchard.engines.exceptions import CheckpointError
from orchard.engines.vllm_worker import OrchardWorkerExtension


class FakeModel(torch.nn.Module):
    """Loads what it is given by name, as vLLM models do (``load_weights(weights=iterable)``)."""

    def __init__(self, consume: bool = True) -> None:
        super().__init__()
        self.norm = torch.nn.Parameter(torch.zeros(4))
        self.embed = torch.nn.Parameter(torch.zeros(3, 4))
        self.consume = consume

    def load_weights(self, weights: Any) -> set[str]:
        loaded = set()
        for name, tensor in weights:
            getattr(self, name.split(".")[-2]).data.copy_(tensor)
            loaded.add(name)
            if not self.consume:
                break
        return loaded


def worker(model: FakeModel) -> OrchardWorkerExtension:
    extension = OrchardWorkerExtension()
    extension.model_runner = SimpleNamespace(model=model)
    return extension


def write(directory: Path) -> Path:
    directory.mkdir()
    save_file({"model.norm.weight": torch.ones(4)}, directory / "model-00001-of-00002.safetensors")
    save_file({"model.embed.weight": torch.full((3, 4), 2.0)}, directory / "model-00002-of-00002.safetensors")
    return directory


def test_every_tensor_of_every_file_is_loaded_and_the_digest_shows_it(tmp_path: Path) -> None:
    model = FakeModel()
    extension = worker(model)
    assert extension.orchard_weights_digest() == {"parameters": 2, "sum": 0.0}
    assert extension.orchard_load_weights(str(write(tmp_path / "v1"))) == {"files": 2, "tensors": 2}
    assert extension.orchard_weights_digest() == {"parameters": 2, "sum": 4.0 + 24.0}


def test_a_loader_that_stops_early_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="consumed 1 of the 2 tensors"):
        worker(FakeModel(consume=False)).orchard_load_weights(str(write(tmp_path / "v1")))


def test_a_directory_without_weights_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        worker(FakeModel()).orchard_load_weights(str(tmp_path))


def test_the_extension_module_imports_without_torch_or_vllm() -> None:
    code = "import sys, orchard.engines.vllm_worker; print('torch' in sys.modules, 'vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
