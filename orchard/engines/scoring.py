"""Scoring a given token sequence: the logprob the model gives each token after the tokens before it.

This is what ``/v1/completions`` with ``echo: true`` and ``logprobs`` answers for the prompt part (and what
on-policy distillation asks a teacher for). It is one plain forward pass of the unpadded sequence, outside the
batching scheduler: position ``i``'s logits are ``log_softmax``-ed in float32 and read at token ``i + 1``, the same
raw logprob the sampler reports for a token it draws (``orchard.engines.sampling``), so a model scoring its own
sample gives back the logprobs it sampled with (up to floating-point differences between a batched, cached decode
and one full pass). The first token has no logprob (``None``), as in OpenAI's and vLLM's answers.

The vocabulary-sized float32 log-softmax is taken ``CHUNK_TOKENS`` positions at a time, so scoring a long sequence
on a large-vocabulary model holds the model's own logits plus one chunk, not a second full copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

CHUNK_TOKENS = 1024


@dataclass(frozen=True, slots=True)
class SequenceScores:
    """Per-token logprobs of a sequence (``None`` for the first token) and, per token, the top alternatives.

    ``top[i]`` maps token id to logprob for the ``top_n`` most likely tokens at position ``i`` plus the actual
    token (vLLM's convention: ``top_n == 0`` gives the actual token alone); it is ``None`` at position 0.
    """

    token_ids: list[int]
    logprobs: list[float | None]
    top: list[dict[int, float] | None]


@torch.inference_mode()
def score_sequence(model: PreTrainedModel, token_ids: Sequence[int], top_n: int = 0) -> SequenceScores:
    """Score ``token_ids`` with ``model`` in one forward pass (see the module docstring)."""
    ids = list(token_ids)
    device = next(model.parameters()).device
    inputs = torch.tensor([ids], dtype=torch.long, device=device)
    logits = model(input_ids=inputs, use_cache=False).logits[0, :-1]  # position i predicts token i + 1
    targets = inputs[0, 1:]
    logprobs: list[float | None] = [None]
    top: list[dict[int, float] | None] = [None]
    for start in range(0, targets.numel(), CHUNK_TOKENS):
        chunk = logits[start : start + CHUNK_TOKENS].float().log_softmax(dim=-1)
        wanted = targets[start : start + CHUNK_TOKENS]
        chosen = chunk.gather(-1, wanted.unsqueeze(-1)).squeeze(-1)
        logprobs.extend(chosen.tolist())
        top.extend(_top_alternatives(chunk, wanted, chosen, top_n))
    return SequenceScores(ids, logprobs, top)


def _top_alternatives(
    chunk: torch.Tensor, wanted: torch.Tensor, chosen: torch.Tensor, top_n: int
) -> list[dict[int, float] | None]:
    if top_n == 0:
        return [{token: logprob} for token, logprob in zip(wanted.tolist(), chosen.tolist(), strict=True)]
    values, indices = chunk.topk(min(top_n, chunk.shape[-1]), dim=-1)
    rows: list[dict[int, float] | None] = []
    for token, logprob, row_ids, row_values in zip(
        wanted.tolist(), chosen.tolist(), indices.tolist(), values.tolist(), strict=True
    ):
        rows.append(dict(zip(row_ids, row_values, strict=True)) | {token: logprob})
    return rows
