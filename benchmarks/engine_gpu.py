"""The local engine on a GPU: tokens/s through its continuous-batching scheduler beside ``model.generate``.

For the GPU check of the engine issue: a small Llama-style checkpoint (~150M parameters, the project's own
tokenizer, built here from a config — nothing downloaded) served by ``LocalEngine`` on CUDA in bf16, measured in
process (no HTTP) at several concurrencies, beside static-batch ``model.generate`` on the same prompts, greedy,
in the same run. Needs only torch, transformers, pydantic(-settings) and structlog.

    python benchmarks/engine_gpu.py [--max-tokens 128] [--layers 12] [--hidden 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from orchard.engines.local import LocalEngine, load_model
from orchard.engines.sampling import SamplingParams
from orchard.engines.tiny import TINY_CHAT_TEMPLATE, build_tiny_tokenizer

CONCURRENCY = (1, 8, 32, 64)


def build_checkpoint(dest: Path, hidden: int, layers: int) -> tuple[Path, int]:
    """A randomly initialised Llama of the given size with the project's tokenizer; return (dir, parameters)."""
    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=int(hidden * 2.75), num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=hidden // 128, max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(dest)
    tokenizer.chat_template = tokenizer.chat_template or TINY_CHAT_TEMPLATE
    tokenizer.save_pretrained(dest)
    return dest, sum(p.numel() for p in model.parameters())


def prompts(count: int) -> list[list[dict[str, str]]]:
    """Distinct short conversations of different lengths."""
    return [[{"role": "user", "content": f"Task {i}: explain the failing test. " * (1 + i % 5)}] for i in range(count)]


async def scheduler_run(engine: LocalEngine, conversations: list[Any], concurrency: int, max_tokens: int) -> int:
    """Completion tokens generated through the engine's scheduler by ``concurrency`` clients."""
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
def generate_run(engine: LocalEngine, model: Any, conversations: list[Any], batch: int, max_tokens: int) -> int:
    """``model.generate`` over the same prompts in static batches (tokens up to end of turn)."""
    tokenizer, total = engine.tokenizer, 0
    eos = tokenizer.eos_token_id
    for start in range(0, len(conversations), batch):
        ids = [engine.render_prompt(c) for c in conversations[start : start + batch]]
        padded = tokenizer.pad({"input_ids": ids}, padding=True, return_tensors="pt").to(engine.device)
        out = model.generate(**padded, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        for row in out[:, padded["input_ids"].shape[1] :].tolist():
            total += row.index(eos) + 1 if eos in row else len(row)
    torch.cuda.synchronize()
    return total


def rate(run: Any) -> float:
    """Tokens per second of ``run()``."""
    start = time.perf_counter()
    tokens = run()
    return tokens / (time.perf_counter() - start)


def main() -> None:
    """Build, serve in process, measure, print JSON lines and a table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args()
    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}), flush=True)  # noqa: T201
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint, parameters = build_checkpoint(Path(tmp) / "small-llama", args.hidden, args.layers)
        engine = LocalEngine(checkpoint, model_name="small-llama", max_batch_size=64, max_queue=1024,
                             device="cuda", dtype="bfloat16")  # fmt: skip
        engine.start()
        model = load_model(checkpoint, engine.device, engine.dtype)
        asyncio.run(scheduler_run(engine, prompts(4), 4, 8))  # warm-up
        generate_run(engine, model, prompts(4), 4, 8)
        rows = []
        for concurrency in CONCURRENCY:
            conversations = prompts(max(16, 2 * concurrency))
            engine_rates, generate_rates = [], []
            for _ in range(2):
                engine_rates.append(rate(lambda c=conversations, n=concurrency: asyncio.run(
                    scheduler_run(engine, c, n, args.max_tokens))))  # fmt: skip
                generate_rates.append(rate(lambda c=conversations, n=concurrency: generate_run(
                    engine, model, c, n, args.max_tokens)))  # fmt: skip
            row = {"concurrency": concurrency, "requests": len(conversations), "engine_tok_s": max(engine_rates),
                   "generate_tok_s": max(generate_rates), "parameters": parameters}  # fmt: skip
            row["ratio"] = row["engine_tok_s"] / row["generate_tok_s"]
            rows.append(row)
            print(json.dumps(row), flush=True)  # noqa: T201
        engine.close()
    print("concurrency  requests  engine tok/s  generate tok/s  ratio")  # noqa: T201
    for r in rows:
        cells = (r["concurrency"], r["requests"], r["engine_tok_s"], r["generate_tok_s"], r["ratio"])
        print("{:>11}  {:>8}  {:>12.0f}  {:>14.0f}  {:>5.2f}".format(*cells))  # noqa: T201


if __name__ == "__main__":
    main()
