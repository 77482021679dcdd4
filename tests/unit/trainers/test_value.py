"""The value model on a tiny CPU backbone: it learns to tell successful trajectories from failed ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from orchard.engines.tiny import build_tiny_checkpoint, build_tiny_tokenizer
from orchard.trajectory import Step, Trajectory
from trainers.value import (
    ValueExample,
    ValueModel,
    ValueModelConfig,
    fit,
    pad_batch,
    roc_auc,
    trajectory_label,
    trajectory_tokens,
)

MARKER_TEXT = "All tests passed."
VOCAB_LOW, VOCAB_HIGH = 3, 400  # plain BPE pieces of the tiny tokenizer (specials and tool tags are above)


def marker_tokens() -> np.ndarray:
    return np.asarray(build_tiny_tokenizer().encode(MARKER_TEXT), dtype=np.int64)


def synthetic_examples(count: int, seed: int) -> list[ValueExample]:
    """Random token sequences; the successful half carries the marker near the end (as a final test run would)."""
    rng = np.random.default_rng(seed)
    marker = marker_tokens()
    examples = []
    for index in range(count):
        success = index % 2 == 0
        body = rng.integers(VOCAB_LOW, VOCAB_HIGH, size=int(rng.integers(24, 48)))
        tail = rng.integers(VOCAB_LOW, VOCAB_HIGH, size=int(rng.integers(0, 6)))
        middle = marker if success else rng.integers(VOCAB_LOW, VOCAB_HIGH, size=marker.size)
        examples.append(ValueExample(np.concatenate([body, middle, tail]).astype(np.int64), float(success)))
    return examples


def step(call_index: int, prompt: list[int], completion: list[int]) -> Step:
    return Step(
        call_index=call_index,
        conversation_id=0,
        policy_version=1,
        prompt_token_ids=np.asarray(prompt, dtype=np.int32),
        completion_token_ids=np.asarray(completion, dtype=np.int32),
        completion_logprobs=np.zeros(len(completion), dtype=np.float32),
        request_messages=[],
        response_text="",
        response_tool_calls=[],
        finish_reason="stop",
    )


def trajectory(steps: tuple[Step, ...], *, success: bool = True, reward: float = 1.0) -> Trajectory:
    return Trajectory(
        run_id="r", episode_id="ep", task_id="t", group_id="g", steps=steps, success=success, reward=reward
    )


def micro(max_length: int = 64, pooling: str = "last") -> ValueModel:
    return ValueModel.build(ValueModelConfig(model="tiny-llama-micro", max_length=max_length, pooling=pooling))


def test_value_model_separates_successful_from_failed_trajectories_on_held_out_data() -> None:
    torch.manual_seed(0)
    model = micro()
    train, held_out = synthetic_examples(160, seed=1), synthetic_examples(80, seed=2)

    losses = fit(model, train, epochs=3, batch_size=16, learning_rate=1e-3, seed=0)
    scores = model.predict([example.tokens for example in held_out])
    labels = [example.label for example in held_out]

    assert roc_auc(scores.tolist(), labels) > 0.85
    assert float(np.mean((scores > 0.5) == np.asarray(labels, dtype=bool))) > 0.75
    assert np.mean(losses[-5:]) < np.log(2) - 0.2  # well below the 0.693 of a coin flip


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_an_untrained_value_model_gives_every_sequence_one_half(pooling: str) -> None:
    scores = micro(pooling=pooling).predict([np.arange(5, 20), np.arange(30, 33)])

    assert scores.tolist() == [0.5, 0.5]


def test_batched_prediction_ignores_padding() -> None:
    torch.manual_seed(0)
    model = micro()
    fit(model, synthetic_examples(32, seed=3), epochs=1, batch_size=16, learning_rate=1e-3)
    short, long = np.arange(5, 12), np.arange(40, 90)

    together = model.predict([short, long])
    alone = np.concatenate([model.predict([short]), model.predict([long])])

    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_trajectory_tokens_are_the_last_calls_prompt_and_completion_cut_from_the_left() -> None:
    first = step(0, [5, 6], [7])
    last = step(1, [5, 6, 7, 8, 9, 10], [11, 12])

    tokens = trajectory_tokens(trajectory((last, first)), max_length=5)

    assert tokens.tolist() == [8, 9, 10, 11, 12]


def test_a_trajectory_without_model_calls_has_nothing_to_judge() -> None:
    with pytest.raises(ValueError, match="episode 'ep' has no model calls"):
        trajectory_tokens(trajectory(()), max_length=8)


def test_labels_come_from_success_or_the_reward_clipped_to_one() -> None:
    assert trajectory_label(trajectory((), success=False, reward=0.3)) == 0.0
    assert trajectory_label(trajectory((), success=True, reward=0.3)) == 1.0
    assert trajectory_label(trajectory((), reward=0.3), "reward") == 0.3
    assert trajectory_label(trajectory((), reward=7.0), "reward") == 1.0
    assert trajectory_label(trajectory((), reward=-2.0), "reward") == 0.0


def test_a_saved_value_model_loads_back_with_identical_predictions(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = micro(max_length=32)
    fit(model, synthetic_examples(32, seed=4), epochs=1, batch_size=16, learning_rate=1e-3)
    probe = [example.tokens for example in synthetic_examples(6, seed=5)]

    files = model.save(tmp_path / "v")
    loaded = ValueModel.load(tmp_path / "v")

    assert {"model.safetensors", "config.json", "orchard_value.json", "tokenizer.json"} <= set(files)
    assert (loaded.max_length, loaded.pooling) == (32, "last")
    np.testing.assert_array_equal(loaded.predict(probe), model.predict(probe))
    assert loaded.encode_text(MARKER_TEXT).tolist() == marker_tokens().tolist()


def test_building_from_a_saved_directory_loads_the_value_model(tmp_path: Path) -> None:
    model = micro()
    model.save(tmp_path / "v")

    rebuilt = ValueModel.build(ValueModelConfig(model=str(tmp_path / "v")))

    assert isinstance(rebuilt, ValueModel)
    assert rebuilt.max_length == 64


def test_token_ids_outside_the_vocabulary_are_refused_by_name() -> None:
    model = micro()

    vocabulary = rf"\[0, {len(build_tiny_tokenizer())}\)"
    with pytest.raises(
        ValueError, match=rf"sequence 1 has token ids outside the value model's vocabulary {vocabulary}"
    ):
        model.predict([np.arange(3, 9), np.array([5, 100_000])])


def test_an_unknown_backbone_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'no-such-model' is neither a tiny-family name nor a directory"):
        ValueModel.build(ValueModelConfig(model="no-such-model"))


def test_padding_is_on_the_right_with_a_mask() -> None:
    input_ids, mask = pad_batch([[4, 5, 6], [7]], pad_id=0)

    assert input_ids.tolist() == [[4, 5, 6], [7, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_auc_counts_ties_as_half() -> None:
    assert roc_auc([0.9, 0.4, 0.4, 0.1], [1, 1, 0, 0]) == 0.875


def test_a_causal_lm_checkpoint_directory_becomes_the_backbone_with_its_tokenizer(tmp_path: Path) -> None:
    checkpoint = build_tiny_checkpoint("tiny-llama-micro", tmp_path / "ckpt", seed=3)

    model = ValueModel.build(ValueModelConfig(model=str(checkpoint), max_length=16))

    assert type(model.backbone).__name__ == "LlamaModel"
    causal_lm = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert torch.equal(model.backbone.embed_tokens.weight, causal_lm.model.embed_tokens.weight)
    assert model.encode_text(MARKER_TEXT).tolist() == marker_tokens().tolist()
    assert model.predict([np.arange(5, 30)]).tolist() == [0.5]
