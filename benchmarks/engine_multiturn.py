"""The local engine on an agent's workload, with its prefix cache and without, in the same run.

An agent episode here is what a file-lookup RL episode asks of the engine: ``--calls`` model calls, each prompt the
shared system prompt and tools (``--system-tokens``, the same for every episode), the episode's instruction, then
every earlier call's answer and a tool result; each answer sampled at temperature 1 up to ``--answer-tokens``.
``--episodes`` such episodes run ``--concurrency`` at a time through the engine's batching scheduler (in process, no
HTTP: the engine's own work only), on the tiny model built here.

It prints, for the cache off and on: episodes/s, prompt tokens prefilled per episode and tokens reused from the
cache, and the ratio. Both runs use the same prompts and seeds; each figure is the best of ``--repeats`` interleaved
runs (other load on a shared machine only ever slows a run down).

    python benchmarks/engine_multiturn.py [--episodes 64] [--concurrency 16] [--calls 3] [--repeats 3] [--threads 1]
"""
# ruff: noqa: E402, T201, S311  (a script: its own folder leaves sys.path first; it prints its report; seeded test data)

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import asyncio
import random
import tempfile
import time
from dataclasses import dataclass

import torch

from orchard.engines.batching import ServingModel
from orchard.engines.local import LocalEngine
from orchard.engines.sampling import SamplingParams
from orchard.engines.tiny import build_tiny_checkpoint


@dataclass
class RunResult:
    """One run's figures."""

    seconds: float
    episodes: int
    prefilled: int
    reused: int


async def episode(engine: LocalEngine, system: list[int], index: int, args: argparse.Namespace) -> None:
    """One episode's calls, each prompt extending the last (answer, then a tool result)."""
    rng = random.Random(index)
    vocab = engine.vocab_size
    prompt = system + [rng.randrange(10, vocab) for _ in range(args.instruction_tokens)]
    for call in range(args.calls):
        params = SamplingParams(max_tokens=args.answer_tokens, temperature=1.0, seed=index * 100 + call)
        (completion,) = await engine.scheduler.submit(list(prompt), params).completions()
        prompt += completion.token_ids + [rng.randrange(10, vocab) for _ in range(args.tool_tokens)]


async def run_once(engine: LocalEngine, args: argparse.Namespace) -> RunResult:
    """``--episodes`` episodes, ``--concurrency`` at a time."""
    system = [random.Random(0).randrange(10, engine.vocab_size) for _ in range(args.system_tokens)]
    stats = engine.scheduler.stats
    prefilled, reused = stats.prefilled_tokens, stats.reused_tokens
    gate = asyncio.Semaphore(args.concurrency)

    async def bounded(index: int) -> None:
        async with gate:
            await episode(engine, system, index, args)

    started = time.perf_counter()
    await asyncio.gather(*(bounded(i) for i in range(args.episodes)))
    seconds = time.perf_counter() - started
    return RunResult(seconds, args.episodes, stats.prefilled_tokens - prefilled, stats.reused_tokens - reused)


def make_engine(checkpoint: Path, cache_mb: int, args: argparse.Namespace) -> LocalEngine:
    """A local engine on the tiny checkpoint (started), with a prefix cache of ``cache_mb`` MiB."""
    engine = LocalEngine(
        checkpoint,
        model_name="tiny",
        max_batch_size=args.concurrency,
        prefix_cache_mb=cache_mb,
        max_context=2048,
        cpu_threads=args.threads,
    )
    engine.start()
    return engine


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--system-tokens", type=int, default=650)
    parser.add_argument("--instruction-tokens", type=int, default=30)
    parser.add_argument("--answer-tokens", type=int, default=30)
    parser.add_argument("--tool-tokens", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default="tiny-llama")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as work:
        checkpoint = build_tiny_checkpoint(args.model, Path(work) / "model", seed=0)
        engines = {"cache off": make_engine(checkpoint, 0, args), "cache on": make_engine(checkpoint, 256, args)}
        best: dict[str, RunResult] = {}
        try:
            for _ in range(args.repeats):
                for name, engine in engines.items():
                    # a fresh cohort each repeat: the cache starts empty, as after a policy reload
                    engine.scheduler.install(ServingModel(engine.scheduler.serving.model, 0))
                    result = asyncio.run(run_once(engine, args))
                    if name not in best or result.seconds < best[name].seconds:
                        best[name] = result
        finally:
            for engine in engines.values():
                engine.close()
    print(f"\n{'engine':<10} {'episodes/s':>11} {'prefilled/episode':>18} {'reused/episode':>15}")
    for name, result in best.items():
        print(
            f"{name:<10} {result.episodes / result.seconds:>11.2f} {result.prefilled / result.episodes:>18.0f} "
            f"{result.reused / result.episodes:>15.0f}"
        )
    off, on = best["cache off"], best["cache on"]
    print(f"cache on / cache off: x{off.seconds / on.seconds:.2f} episodes/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
