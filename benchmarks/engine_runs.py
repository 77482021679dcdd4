"""The same greedy work two ways, for the engine benchmarks: the local engine's scheduler in process, and a static-batch
``model.generate`` loop over the same prompts; tokens are counted up to and including the end of turn in both."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import torch

from orchard.engines.local import LocalEngine
from orchard.engines.sampling import SamplingParams

Conversation = list[dict[str, str]]


async def scheduler_run(
    engine: LocalEngine, conversations: list[Conversation], concurrency: int, max_tokens: int
) -> int:
    """Completion tokens generated through the engine's scheduler by ``concurrency`` clients (no HTTP, no JSON)."""
    queue = [engine.render_prompt(c) for c in conversations]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    total = 0

    async def client() -> None:
        nonlocal total
        while queue:
            [completion] = await engine.submit(queue.pop(), params).completions()
            total += len(completion.token_ids)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return total


@torch.inference_mode()
def generate_run(
    engine: LocalEngine, model: Any, conversations: list[Conversation], batch: int, max_tokens: int
) -> int:
    """``model.generate`` over the same prompts in static batches of ``batch`` (left padding, same
    ``max_new_tokens``); return the completion tokens up to the end of turn."""
    tokenizer, total = engine.tokenizer, 0
    eos = tokenizer.eos_token_id
    for start in range(0, len(conversations), batch):
        ids = [engine.render_prompt(c) for c in conversations[start : start + batch]]
        padded = tokenizer.pad({"input_ids": ids}, padding=True, return_tensors="pt").to(engine.device)
        out = model.generate(**padded, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        for row in out[:, padded["input_ids"].shape[1] :].tolist():
            total += row.index(eos) + 1 if eos in row else len(row)
    if engine.device.type == "cuda":  # the clock stops only once the GPU has finished what it was given
        torch.cuda.synchronize()
    return total


def tokens_per_second(run: Callable[[], int]) -> float:
    """Tokens per second of ``run()`` (which returns the tokens it generated)."""
    start = time.perf_counter()
    tokens = run()
    return float(tokens / (time.perf_counter() - start))
