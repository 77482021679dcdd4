"""Micro-batches of a step, packed into rows or padded one sample per row: the same loss and gradients as one sample
at a time; packing wastes no position."""

from __future__ import annotations

import pytest
import torch

from trainers.batching import pack_row, pack_step, pad_rows, padding_waste, plan_padded, plan_rows, sample_from_record
from trainers.config import TinyModelSource
from trainers.exceptions import InvalidSampleError
from trainers.losses import packed_loss, token_logprobs
from trainers.model import load_policy_model
from trainers.synthetic import synthetic_sample, synthetic_stream

TINY_VOCAB = 420


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_a_step_gives_the_same_loss_and_gradients_as_per_sample_computation(layout: str) -> None:
    model = load_policy_model(TinyModelSource(name="tiny-llama-micro", seed=3)).train()
    records = synthetic_stream(5, kinds=("RL", "SFT"), vocab_size=TINY_VOCAB, lengths=(17, 40, 25, 33, 9))
    samples = [sample_from_record(r) for r in records]
    normalizer = float(sum(s.num_loss_tokens for s in samples))

    def loss_and_grads(batches: list) -> tuple[float, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=torch.float64)
        for batch in batches:
            logits = model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False).logits
            out = packed_loss(token_logprobs(logits, batch.targets), batch, normalizer=normalizer)
            out.loss.backward()
            total += out.loss.detach().double()
        return float(total), [p.grad.clone() for p in model.parameters()]

    batched = pack_step(samples, batch_tokens=80, layout=layout)  # type: ignore[arg-type]
    one_by_one = [pack_row([s]) for s in samples]
    assert len(batched) < len(one_by_one) and max(len(b.sample_ids) for b in batched) >= 2
    assert layout == "packed" or max(b.input_ids.shape[0] for b in batched) >= 2
    batched_loss_value, batched_grads = loss_and_grads(batched)
    single_loss_value, single_grads = loss_and_grads(one_by_one)
    assert batched_loss_value == pytest.approx(single_loss_value, rel=1e-5)
    for a, b in zip(batched_grads, single_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_padded_batches_count_the_padding_against_the_budget_longest_first() -> None:
    batches = plan_padded([50, 30, 70, 20, 130, 10], budget=100)
    assert batches == [[4], [2], [0, 1], [3, 5]]  # 130 alone (over budget) | 70 (70 + 70 > 100) | 2 x 50 | 2 x 20
    lengths = [50, 30, 70, 20, 130, 10]
    assert all(len(b) * lengths[b[0]] <= 100 for b in batches if len(b) > 1)
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert plan_padded([10] * 8, budget=80, pad_to_multiple=16) == [[0, 1, 2, 3, 4], [5, 6, 7]]  # 5 rows of 16 fit


def test_a_padded_batch_has_one_row_per_sample_positions_running_through_the_padding() -> None:
    a = sample_from_record(synthetic_sample(0, kind="SFT", vocab_size=TINY_VOCAB, length=4))
    b = sample_from_record(synthetic_sample(1, kind="RL", vocab_size=TINY_VOCAB, length=3))
    batch = pad_rows([a, b], pad_token_id=0, pad_to_multiple=1)
    assert batch.input_ids.shape == (2, 4)
    assert batch.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert batch.targets[1, :2].tolist() == b.token_ids[1:].tolist()
    assert batch.loss_mask[1].tolist() == [*b.loss_mask[1:].tolist(), 0, 0]
    assert batch.is_rl.tolist() == [[False] * 4, [True, True, False, False]]
    assert (batch.num_tokens, batch.padded_tokens) == (7, 1)
    assert padding_waste([batch]) == 1 / 8


def test_rows_respect_the_budget_and_an_oversized_sample_gets_its_own_row() -> None:
    rows = plan_rows([50, 30, 70, 20, 130, 10], budget=100)
    assert rows == [[4], [1, 2], [0, 3, 5]]  # first-fit decreasing: 130 | 70+30 | 50+20+10, each in input order
    lengths = [50, 30, 70, 20, 130, 10]
    assert all(sum(lengths[i] for i in row) <= 100 for row in rows if len(row) > 1)
    assert sorted(i for row in rows for i in row) == list(range(6))


def test_a_packed_row_shifts_targets_and_restarts_positions_per_sample() -> None:
    a = sample_from_record(synthetic_sample(0, kind="SFT", vocab_size=TINY_VOCAB, length=4))
    b = sample_from_record(synthetic_sample(1, kind="RL", vocab_size=TINY_VOCAB, length=3))
    row = pack_row([a, b], pad_token_id=0, pad_to_multiple=8)
    assert row.position_ids[0].tolist() == [0, 1, 2, 3, 0, 1, 2, 0]
    assert row.targets[0, :3].tolist() == a.token_ids[1:].tolist()
    assert row.targets[0, 4:6].tolist() == b.token_ids[1:].tolist()
    assert row.loss_mask[0].tolist() == [*a.loss_mask[1:].tolist(), 0, *b.loss_mask[1:].tolist(), 0, 0]
    assert row.is_rl[0].tolist() == [False] * 4 + [True, True] + [False] * 2
    assert (row.num_tokens, row.padded_tokens) == (7, 1)
    assert padding_waste([row]) == 1 / 8
    assert padding_waste(pack_step([a, b], batch_tokens=64)) == 0.0


def test_sample_with_mismatched_arrays_is_rejected_naming_the_field() -> None:
    record = synthetic_sample(0, kind="RL", vocab_size=TINY_VOCAB, length=8)
    record["advantages"] = record["advantages"][:-4]
    with pytest.raises(InvalidSampleError, match="advantages has 7 values for 8 tokens"):
        sample_from_record(record)
