"""The KV batch: sequences joining and leaving a left-padded batch compute what an unpadded forward pass does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.utils import logging as hf_logging

from orchard.engines.kv_batch import KVBatch, _kv_layers
from orchard.engines.tiny import build_tiny_checkpoint


@pytest.fixture(scope="module", params=["tiny-llama-micro", "tiny-qwen2"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> PreTrainedModel:
    hf_logging.disable_progress_bar()
    path: Path = build_tiny_checkpoint(request.param, tmp_path_factory.mktemp("kv") / request.param, seed=0)
    return AutoModelForCausalLM.from_pretrained(path).eval()


def _greedy(logits: torch.Tensor) -> list[int]:
    return logits.argmax(-1).tolist()


def test_join_step_leave_matches_direct_forward(model: PreTrainedModel) -> None:
    prompts = [[5, 6, 7], [8] * 11, [9, 10], list(range(20, 36))]
    generated: dict[int, list[int]] = {i: [] for i in range(4)}
    logits_seen: dict[int, list[torch.Tensor]] = {i: [] for i in range(4)}
    batch = KVBatch(model, pad_token_id=0)
    rows = [0, 1]

    def record(logits: torch.Tensor) -> list[int]:
        for row, row_logits in zip(rows, logits, strict=True):
            logits_seen[row].append(row_logits)
            generated[row].append(int(row_logits.argmax()))
        return [generated[r][-1] for r in rows]

    tokens = record(batch.prefill([prompts[0], prompts[1]]))
    for _ in range(3):
        tokens = record(batch.decode(tokens))
    rows = [0, 1, 2, 3]  # two more join a running batch (their prompts shorter and longer than its width)
    decoded = batch.decode(tokens)  # as the scheduler does: running rows step, then new rows are appended
    joined = batch.prefill([prompts[2], prompts[3]])
    tokens = record(torch.cat([decoded, joined]))
    width = batch.width
    batch.keep([0, 1, 2])  # the longest row leaves: the padding only it needed goes with it
    rows = [0, 1, 2]
    assert batch.width < width
    tokens = record(batch.decode(tokens[:3]))
    for _ in range(2):
        tokens = record(batch.decode(tokens))
    assert not any(torch.isnan(k).any() or torch.isnan(v).any() for k, v in _kv_layers(batch._cache))

    with torch.inference_mode():
        for row in range(4):
            ids = prompts[row] + generated[row][:-1]
            direct = model(torch.tensor([ids])).logits[0, len(prompts[row]) - 1 :].float()
            torch.testing.assert_close(torch.stack(logits_seen[row]), direct, atol=1e-4, rtol=1e-4)


def test_emptied_batch_starts_afresh(model: PreTrainedModel) -> None:
    batch = KVBatch(model, pad_token_id=0)
    batch.prefill([[1, 2, 3]])
    batch.keep([])
    assert (batch.size, batch.width) == (0, 0)
    again = batch.prefill([[4, 5]])
    with torch.inference_mode():
        direct = model(torch.tensor([[4, 5]])).logits[0, -1].float()
    torch.testing.assert_close(again[0], direct, atol=1e-5, rtol=1e-5)
