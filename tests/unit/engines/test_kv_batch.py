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


def _run(batch: KVBatch, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Prefill ``prompt`` alone, then greedy-decode ``steps`` tokens; its tokens and the logits of each."""
    logits = [batch.prefill([prompt])[0]]
    tokens = [int(logits[-1].argmax())]
    for _ in range(steps):
        logits.append(batch.decode([tokens[-1]])[0])
        tokens.append(int(logits[-1].argmax()))
    return tokens, logits


def test_a_prompt_sharing_a_remembered_prefix_prefills_only_its_rest_and_computes_what_a_fresh_forward_does(
    model: PreTrainedModel,
) -> None:
    batch = KVBatch(model, pad_token_id=0, prefix_cache_bytes=2**28)
    system = list(range(20, 60))  # the shared opening of every prompt
    first = system + [5, 6, 7]
    tokens, _ = _run(batch, first, steps=4)
    batch.remember(0, first + tokens[:-1])  # what the row was fed: its prompt and all but the last answer token
    batch.keep([])
    assert (len(batch.prefix_cache), batch.prefix_cache.tokens_held) == (1, len(first) + 4)
    widening = batch.prefill([list(range(200, 200 + len(first) + 8)), first + [1, 2]])  # a long miss beside a hit
    assert batch.reused_tokens == 0 and widening.shape[0] == 2  # would widen the batch: prefilled in full instead
    batch.keep([])

    follow_up = first + tokens[:-1] + [9, 10, 11]  # the next call of the episode: the turn so far, then a tool result
    other = system + [12, 13]  # another episode's first call: only the system prompt is shared
    prefilled, reused = batch.prefilled_tokens, batch.reused_tokens
    logits = batch.prefill([follow_up, other, [3, 4]])  # a prompt with nothing to reuse joins the same pass
    assert batch.reused_tokens - reused == len(first) + 4 + len(system)
    assert batch.prefilled_tokens - prefilled == 3 + 2 + 2
    decoded = batch.decode(logits.argmax(-1).tolist())
    with torch.inference_mode():
        for row, prompt in enumerate([follow_up, other, [3, 4]]):
            ids = prompt + [int(logits[row].argmax())]
            direct = model(torch.tensor([ids])).logits[0, -2:].float()
            torch.testing.assert_close(torch.stack([logits[row], decoded[row]]), direct, atol=1e-4, rtol=1e-4)


def test_the_prefix_cache_keeps_its_token_budget_and_a_longer_sequence_replaces_its_prefix() -> None:
    from orchard.engines.prefix_cache import PrefixCache

    def layers(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.zeros(1, 2, n, 4), torch.zeros(1, 2, n, 4))]

    per_token = 2 * 2 * 4 * 4  # keys and values, 2 heads of 4 float32 each
    cache = PrefixCache(max_bytes=100 * per_token, min_reuse=4)
    cache.remember(list(range(40)), layers(40))
    cache.remember(list(range(50)), layers(50))  # extends the first: it takes its place
    assert (len(cache), cache.tokens_held, cache.bytes_held) == (1, 50, 50 * per_token)
    cache.remember(list(range(100, 160)), layers(60))  # over budget together: the least recently used goes
    assert (len(cache), cache.tokens_held, cache.bytes_held) == (1, 60, 60 * per_token)
    cache.remember(list(range(200, 301)), layers(101))  # larger than the whole budget: not kept
    assert (len(cache), cache.tokens_held) == (1, 60)
    hit = cache.lookup(list(range(100, 130)) + [7])
    assert hit is not None and hit.length == 30 and hit.layers[0][0].shape == (1, 2, 30, 4)
    assert cache.lookup(list(range(100, 103)) + [1, 2]) is None  # shorter than min_reuse: prefilled again
    full = cache.lookup(list(range(100, 160)))  # the whole prompt remembered: its last token still runs
    assert full is not None and full.length == 59
