"""The local engine loading a version from memory: the weights copied into a copy of the served model, or into a
replaced version's model that nothing uses any more; what it leaves to a directory (another config, tensors named
otherwise) and what it refuses."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save, save_file
from transformers import LlamaConfig, LlamaForCausalLM

import orchard.engines.local as local
from orchard.engines.batching import BatchScheduler, ServingModel
from orchard.engines.exceptions import CheckpointError
from orchard.engines.local import LocalEngine, copy_weights
from orchard.engines.tiny import ensure_tiny_checkpoint

TINY = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)


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
    assert engine.load_version_files(version_files(checkpoint, tensors), 1) is True

    assert engine.policy_version == 1
    served = engine.scheduler.serving.model
    assert served is not before
    assert all(torch.equal(served.state_dict()[name], tensor) for name, tensor in tensors.items())
    original = load_file(checkpoint / "model.safetensors")  # requests in flight keep the weights they started on
    assert all(torch.equal(before.state_dict()[name], tensor) for name, tensor in original.items())


@pytest.mark.parametrize(
    "change",
    [lambda t: t.pop("model.layers.0.mlp.up_proj.weight"), lambda t: t.update(extra=torch.zeros(2))],
    ids=["missing", "extra"],
)
def test_a_version_whose_tensors_are_named_otherwise_is_left_to_a_directory(
    engine: LocalEngine, checkpoint: Path, change: object
) -> None:
    """transformers renames some checkpoints' tensors on load (mixture-of-experts models): from_pretrained, not a
    copy by name, decides whether such a version loads (and refuses a partial one, naming what is missing)."""
    tensors = shifted(checkpoint)
    change(tensors)  # type: ignore[operator]
    assert engine.load_version_files(version_files(checkpoint, tensors), 1) is False
    assert engine.policy_version == 0


def test_a_version_with_a_misshapen_tensor_is_refused_and_the_old_one_served(
    engine: LocalEngine, checkpoint: Path
) -> None:
    tensors = shifted(checkpoint)
    tensors["model.norm.weight"] = torch.ones(3)
    with pytest.raises(CheckpointError, match=r"mismatched_keys.*model\.norm\.weight"):
        engine.load_version_files(version_files(checkpoint, tensors), 1)
    assert engine.policy_version == 0


def test_a_version_not_newer_or_not_safetensors_is_refused(engine: LocalEngine, checkpoint: Path) -> None:
    assert engine.load_version_files(version_files(checkpoint, shifted(checkpoint)), 2)
    with pytest.raises(CheckpointError, match="version 2 is not newer than the version served"):
        engine.load_version_files(version_files(checkpoint, shifted(checkpoint)), 2)
    with pytest.raises(CheckpointError, match="cannot load the weights of version 3"):
        engine.load_version_files({"model.safetensors": b"not safetensors"}, 3)
    assert engine.policy_version == 2


def test_a_trainers_config_loads_from_memory_and_another_architecture_is_left_to_a_directory(
    engine: LocalEngine, checkpoint: Path
) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    saved_by_a_trainer = {**config, "use_cache": False, "transformers_version": "0.0"}
    files = {"model.safetensors": save(shifted(checkpoint)), "config.json": json.dumps(saved_by_a_trainer).encode()}
    assert engine.load_version_files(files, 1) is True
    other = {**config, "rms_norm_eps": config.get("rms_norm_eps", 1e-6) * 10}
    files = {"model.safetensors": save(shifted(checkpoint)), "config.json": json.dumps(other).encode()}
    assert engine.load_version_files(files, 2) is False
    assert engine.load_version_files({"model-00001-of-00002.safetensors": b""}, 2) is False  # sharded
    assert engine.policy_version == 1


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


def test_a_mixture_of_experts_version_whose_names_transformers_converts_loads_from_a_directory(
    checkpoint: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer, MixtralConfig, MixtralForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    config = MixtralConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, num_local_experts=2, num_experts_per_tok=1,
    )  # fmt: skip
    torch.manual_seed(0)
    for name in ("v0", "v1"):
        MixtralForCausalLM(config).save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    engine = LocalEngine(tmp_path / "v0", model_name="moe", cpu_threads=1)
    files = {path.name: path.read_bytes() for path in (tmp_path / "v1").iterdir() if path.is_file()}

    assert engine.load_version_files(files, 1) is False  # the file's names are not the loaded model's
    engine.load_version(tmp_path / "v1", 1)
    reference = MixtralForCausalLM.from_pretrained(tmp_path / "v1")
    served = engine.scheduler.serving.model.state_dict()
    assert engine.policy_version == 1
    assert all(torch.equal(served[name], tensor) for name, tensor in reference.state_dict().items())


def _wait_for_spare(engine: LocalEngine) -> None:
    """Until the worker has switched to the newest version between two steps and the one before is drained."""
    deadline = time.monotonic() + 10
    while engine.scheduler._spare is None and time.monotonic() < deadline:  # noqa: SLF001 - what is kept
        time.sleep(0.01)


def _shifted_twice(checkpoint: Path) -> dict[str, torch.Tensor]:
    return {name: tensor + 0.02 for name, tensor in load_file(checkpoint / "model.safetensors").items()}


def _scheduler() -> BatchScheduler:
    """A scheduler with no worker thread, serving a fresh tiny model as version 0."""
    return BatchScheduler(ServingModel(LlamaForCausalLM(TINY), 0), tokenizer=None, eos_token_ids=[2],  # type: ignore[arg-type]
                          pad_token_id=0, max_batch_size=4, max_queue=4)  # fmt: skip


def test_a_replaced_version_that_nothing_uses_any_more_is_overwritten_by_a_later_one(
    engine: LocalEngine, checkpoint: Path
) -> None:
    original = engine.scheduler.serving.model
    engine.start()
    try:
        assert engine.load_version_files(version_files(checkpoint, shifted(checkpoint)), 1)
        first = engine.scheduler.serving.model
        _wait_for_spare(engine)
        newer = _shifted_twice(checkpoint)
        assert engine.load_version_files(version_files(checkpoint, newer), 2)

        served = engine.scheduler.serving.model
        assert served is original  # v0's model, overwritten: no copy allocated
        assert all(torch.equal(served.state_dict()[name], tensor) for name, tensor in newer.items())
        shifted_once = shifted(checkpoint)  # v1, which requests may still be using, is untouched
        assert all(torch.equal(first.state_dict()[name], tensor) for name, tensor in shifted_once.items())
    finally:
        engine.close()


def test_a_version_some_cohort_still_steps_on_is_not_handed_out_as_a_spare() -> None:
    scheduler = _scheduler()
    old = scheduler.serving
    scheduler.install(ServingModel(LlamaForCausalLM(TINY), 1))
    scheduler._switch_version()  # noqa: SLF001 - the worker's step, without a thread
    busy = SimpleNamespace(serving=old, running=[object()], joining=[])
    scheduler._cohorts = [busy]  # type: ignore[list-item]  # noqa: SLF001
    scheduler._keep_drained()  # noqa: SLF001
    assert scheduler.take_spare() is None  # a request still generates on v0

    scheduler._cohorts = []  # noqa: SLF001 - its last sequence finished
    scheduler._keep_drained()  # noqa: SLF001
    assert scheduler.take_spare() is old.model
    assert scheduler.take_spare() is None  # handed out once


def test_a_spare_built_from_another_config_is_not_reused(engine: LocalEngine, checkpoint: Path) -> None:
    original = engine.scheduler.serving.model
    engine.start()
    try:
        assert engine.load_version_files(version_files(checkpoint, shifted(checkpoint)), 1)
        _wait_for_spare(engine)
        original.config.rms_norm_eps = 0.5  # as if loaded from a directory with another epsilon
        newer = _shifted_twice(checkpoint)
        assert engine.load_version_files(version_files(checkpoint, newer), 2)

        served = engine.scheduler.serving.model
        assert served is not original and served.config.rms_norm_eps != 0.5
        assert all(torch.equal(served.state_dict()[name], tensor) for name, tensor in newer.items())
    finally:
        engine.close()


def test_a_model_installed_again_under_another_version_is_never_a_spare() -> None:
    scheduler = _scheduler()
    model = scheduler.serving.model
    scheduler.install(ServingModel(model, 1))  # the same weights, re-wrapped
    scheduler._switch_version()  # noqa: SLF001 - the worker's step, without a thread
    scheduler._keep_drained()  # noqa: SLF001
    assert scheduler.take_spare() is None  # v0's wrapper drained, but its model is served as v1
