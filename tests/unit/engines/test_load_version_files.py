"""The local engine loading a version from memory: the weights copied into a copy of the served model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save, save_file
from transformers import LlamaConfig, LlamaForCausalLM

import orchard.engines.local as local
from orchard.engines.exceptions import CheckpointError
from orchard.engines.local import LocalEngine, copy_weights
from orchard.engines.tiny import ensure_tiny_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_checkpoint("tiny-llama-micro", tmp_path_factory.mktemp("tiny"), 0)


@pytest.fixture
def engine(checkpoint: Path) -> LocalEngine:
    return LocalEngine(checkpoint, model_name="tiny", cpu_threads=1)


def version_files(checkpoint: Path, tensors: dict[str, torch.Tensor]) -> dict[str, bytes]:
    return {"model.safetensors": save(tensors), "config.json": (checkpoint / "config.json").read_bytes()}


def shifted(checkpoint: Path) -> dict[str, torch.Tensor]:
    return {name: tensor + 0.01 for name, tensor in load_file(checkpoint / "model.safetensors").items()}


def test_a_version_in_memory_is_served_without_building_a_model_and_the_old_weights_stay(
    engine: LocalEngine, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was built from a checkpoint directory")

    monkeypatch.setattr(local, "load_model", no_build)
    before = engine.scheduler.serving.model
    tensors = shifted(checkpoint)
    engine.load_version_files(version_files(checkpoint, tensors), 1)

    assert engine.policy_version == 1
    served = engine.scheduler.serving.model
    assert served is not before
    assert all(torch.equal(served.state_dict()[name], tensor) for name, tensor in tensors.items())
    original = load_file(checkpoint / "model.safetensors")  # requests in flight keep the weights they started on
    assert all(torch.equal(before.state_dict()[name], tensor) for name, tensor in original.items())


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda t: t.pop("model.layers.0.mlp.up_proj.weight"), "missing_keys.*up_proj"),
        (lambda t: t.update(extra=torch.zeros(2)), "unexpected_keys.*extra"),
        (lambda t: t.update({"model.norm.weight": torch.ones(3)}), "mismatched_keys.*model.norm.weight"),
    ],
)
def test_a_version_missing_a_tensor_or_with_an_extra_or_misshapen_one_is_refused_and_the_old_one_served(
    engine: LocalEngine, checkpoint: Path, change: object, problem: str
) -> None:
    tensors = shifted(checkpoint)
    change(tensors)  # type: ignore[operator]
    with pytest.raises(CheckpointError, match=problem):
        engine.load_version_files(version_files(checkpoint, tensors), 1)
    assert engine.policy_version == 0


def test_a_version_not_newer_or_not_safetensors_is_refused(engine: LocalEngine, checkpoint: Path) -> None:
    engine.load_version_files(version_files(checkpoint, shifted(checkpoint)), 2)
    with pytest.raises(CheckpointError, match="version 2 is not newer than the version served"):
        engine.load_version_files(version_files(checkpoint, shifted(checkpoint)), 2)
    with pytest.raises(CheckpointError, match="cannot load the weights of version 3"):
        engine.load_version_files({"model.safetensors": b"not safetensors"}, 3)
    assert engine.policy_version == 2


def test_a_version_with_another_config_is_built_from_its_directory(
    engine: LocalEngine, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[Path] = []
    build = local.load_model
    monkeypatch.setattr(local, "load_model", lambda path, *a: built.append(path) or build(path, *a))
    config = json.loads((checkpoint / "config.json").read_text())
    config["rms_norm_eps"] = config.get("rms_norm_eps", 1e-6) * 10
    files = {"model.safetensors": save(shifted(checkpoint)), "config.json": json.dumps(config).encode()}
    engine.load_version_files(files, 1)
    assert len(built) == 1 and engine.policy_version == 1
    assert engine.scheduler.serving.model.config.rms_norm_eps == config["rms_norm_eps"]


def test_tied_weights_absent_from_the_file_are_loaded_through_their_tie(tmp_path: Path) -> None:
    config = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    trained, served = LlamaForCausalLM(config), LlamaForCausalLM(config)
    trained.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    assert "lm_head.weight" not in tensors  # save_pretrained writes one of the tied pair

    copy_weights(served, tensors, "version 1")

    assert torch.equal(served.lm_head.weight, trained.model.embed_tokens.weight)
    assert served.lm_head.weight.data_ptr() == served.model.embed_tokens.weight.data_ptr()
    untied = dict(tensors)
    del untied["model.embed_tokens.weight"]
    save_file(untied, tmp_path / "untied.safetensors")
    with pytest.raises(CheckpointError, match=r"missing_keys.*lm_head.weight.*model.embed_tokens.weight"):
        copy_weights(served, load_file(tmp_path / "untied.safetensors"), "version 2")
