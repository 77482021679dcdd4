"""The local engine on a GPU: tokens/s through its continuous-batching scheduler beside ``model.generate``.

For the GPU check of the engine issue: a small Llama-style checkpoint (~150M parameters, the project's own
tokenizer, built here from a config — nothing downloaded) served by ``LocalEngine`` on CUDA in bf16, measured in
process (no HTTP) at several concurrencies, beside static-batch ``model.generate`` on the same prompts, greedy,
in the same run. Needs only torch, transformers, pydantic(-settings) and structlog.

If ``import vllm`` works (``pip install 'orchard-rl[vllm]'``), the same checkpoint is then served by the vLLM
backend: ``vllm serve`` launched with Orchard's worker extension, the Orchard shim in front of it (over HTTP, so
its figures include the shim and HTTP, which the in-process local figures do not), the same concurrencies, every
answer's token trace checked; then one hot weight swap through the reloader's path (``load_version``: drain,
``collective_rpc`` load, prefix-cache reset), timed, with the served weights' digest before and after and the
policy version of the next answer. ``--no-vllm`` skips it; ``--only-vllm`` skips the local engine.

    python benchmarks/engine_gpu.py [--max-tokens 128] [--layers 12] [--hidden 1024] [--no-vllm|--only-vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from orchard.engines.local import LocalEngine, load_model
from orchard.engines.tiny import TINY_CHAT_TEMPLATE, build_tiny_tokenizer

# Its sibling modules; the folder leaves sys.path again, because a test that loads this file by path must not
# find benchmarks/datasets.py where Hugging Face `datasets` is.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_runs import generate_run, scheduler_run, tokens_per_second  # noqa: E402

sys.path.remove(str(Path(__file__).resolve().parent))

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


def local_rows(checkpoint: Path, parameters: int, max_tokens: int) -> list[dict[str, Any]]:
    """The local engine and ``model.generate`` at each concurrency; frees the GPU memory they used."""
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
            engine_rates.append(tokens_per_second(lambda c=conversations, n=concurrency: asyncio.run(
                scheduler_run(engine, c, n, max_tokens))))  # fmt: skip
            generate_rates.append(tokens_per_second(lambda c=conversations, n=concurrency: generate_run(
                engine, model, c, n, max_tokens)))  # fmt: skip
        row = {"concurrency": concurrency, "requests": len(conversations), "engine_tok_s": max(engine_rates),
               "generate_tok_s": max(generate_rates), "parameters": parameters}  # fmt: skip
        row["ratio"] = row["engine_tok_s"] / row["generate_tok_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)  # noqa: T201
    engine.close()
    return rows


async def http_run(url: str, conversations: list[Any], concurrency: int, max_tokens: int) -> int:
    """Completion tokens generated through an engine's HTTP API by ``concurrency`` clients (traces checked)."""
    import httpx

    from orchard.engines.token_trace import trace_of

    queue, total = list(conversations), 0
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def one_client() -> None:
            nonlocal total
            while queue:
                body = {"model": "small-llama", "messages": queue.pop(), "max_tokens": max_tokens, "temperature": 0}
                response = await client.post("/v1/chat/completions", json=body)
                response.raise_for_status()
                trace = trace_of(response.json())
                assert trace is not None, "an answer without its token trace"
                total += len(trace.completion_token_ids)

        await asyncio.gather(*(one_client() for _ in range(concurrency)))
    return total


def changed_copy(checkpoint: Path, dest: Path) -> Path:
    """The checkpoint's weights with the final norm shifted: a new version whose digest differs."""
    from safetensors.torch import load_file, save_file

    dest.mkdir()
    for path in checkpoint.glob("*.safetensors"):
        tensors = load_file(path)
        tensors = {k: v + 0.5 if k == "model.norm.weight" else v for k, v in tensors.items()}
        save_file(tensors, dest / path.name)
    return dest


def vllm_rows(checkpoint: Path, max_tokens: int, memory: float, eager: bool) -> tuple[dict[int, float], dict[str, Any]]:
    """Tokens/s through the vLLM backend at each concurrency, and one timed hot weight swap."""
    from orchard.engines.config import EngineConfig
    from orchard.engines.vllm_backend import VLLMServer, build_backend, create_vllm_app, free_port, vllm_command
    from orchard.http_server import BackgroundServer

    config = EngineConfig.model_validate({
        "type": "vllm", "model": str(checkpoint), "served_model_name": "small-llama", "dtype": "bfloat16",
        "max_context": 2048, "vllm": {"gpu_memory_utilization": memory, "extra_args": ["--enforce-eager"] * eager},
    })  # fmt: skip
    port = free_port()
    started = time.perf_counter()
    server = VLLMServer(vllm_command(config, str(checkpoint), port, "small-llama"), port)
    server.start(config.vllm.startup_timeout_s)
    print(json.dumps({"vllm_startup_s": round(time.perf_counter() - started, 1)}), flush=True)  # noqa: T201
    try:
        backend = build_backend(config, server.url, checkpoint)
        with BackgroundServer(create_vllm_app(backend)) as shim:
            asyncio.run(http_run(shim.url, prompts(4), 4, 8))  # warm-up
            rates = {}
            for concurrency in CONCURRENCY:
                conversations = prompts(max(16, 2 * concurrency))
                rates[concurrency] = max(tokens_per_second(lambda c=conversations, n=concurrency: asyncio.run(
                    http_run(shim.url, c, n, max_tokens))) for _ in range(2))  # fmt: skip
                print(json.dumps({"concurrency": concurrency, "vllm_tok_s": rates[concurrency]}), flush=True)  # noqa: T201
            with tempfile.TemporaryDirectory() as tmp:
                before = backend.run_blocking(backend.weights_digest(), 60)
                version = changed_copy(checkpoint, Path(tmp) / "v1")
                started = time.perf_counter()
                backend.load_version(version, 1)
                swap = {"swap_s": round(time.perf_counter() - started, 3)}
                after = backend.run_blocking(backend.weights_digest(), 60)
            asyncio.run(http_run(shim.url, prompts(1), 1, 4))
            swap |= {"digest_before": before, "digest_after": after, "policy_version": backend.policy_version}
            print(json.dumps(swap), flush=True)  # noqa: T201
    finally:
        server.stop()
    return rates, swap


def main() -> None:
    """Build, serve, measure, print JSON lines and a table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--no-vllm", action="store_true", help="Skip the vLLM backend even if vLLM is installed.")
    parser.add_argument("--only-vllm", action="store_true", help="Skip the local engine.")
    parser.add_argument("--vllm-memory", type=float, default=0.5, help="vLLM's --gpu-memory-utilization.")
    parser.add_argument("--vllm-eager", action="store_true", help="Launch vLLM with --enforce-eager (faster start).")
    args = parser.parse_args()
    has_vllm = importlib.util.find_spec("vllm") is not None and not args.no_vllm
    info = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "vllm": has_vllm}
    print(json.dumps(info), flush=True)  # noqa: T201
    rows: list[dict[str, Any]] = []
    vllm_rates: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint, parameters = build_checkpoint(Path(tmp) / "small-llama", args.hidden, args.layers)
        if not args.only_vllm:
            rows = local_rows(checkpoint, parameters, args.max_tokens)
            gc.collect()
            torch.cuda.empty_cache()  # vLLM sizes its KV cache from the memory left free
        if has_vllm:
            try:
                vllm_rates, _ = vllm_rows(checkpoint, args.max_tokens, args.vllm_memory, args.vllm_eager)
            except Exception as exc:  # report what ran and what could not; the local figures stand
                print(json.dumps({"vllm_error": repr(exc)}), flush=True)  # noqa: T201
    rows = rows or [{"concurrency": c, "requests": 0, "engine_tok_s": 0.0, "generate_tok_s": 0.0, "ratio": 0.0}
                    for c in CONCURRENCY]  # fmt: skip
    print("concurrency  requests  engine tok/s  generate tok/s  ratio  vllm tok/s")  # noqa: T201
    for r in rows:
        cells = (r["concurrency"], r["requests"], r["engine_tok_s"], r["generate_tok_s"], r["ratio"])
        vllm = vllm_rates.get(r["concurrency"])
        line = "{:>11}  {:>8}  {:>12.0f}  {:>14.0f}  {:>5.2f}".format(*cells)
        print(line + (f"  {vllm:>10.0f}" if vllm is not None else "           -"))  # noqa: T201


if __name__ == "__main__":
    main()
