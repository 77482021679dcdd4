"""``orchard engine serve|scripted``, ``orchard proxy serve`` and ``orchard env serve``: each component alone."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from pydantic import ValidationError

from orchard.cli.common import state
from orchard.config import EmbeddedBusConfig, LocalStoreConfig, describe_validation_error
from orchard.exceptions import ConfigError

engine_app = typer.Typer(help="Inference engines.", no_args_is_help=True)
proxy_app = typer.Typer(help="The recording proxy.", no_args_is_help=True)
env_app = typer.Typer(help="The Orchard Env episode service.", no_args_is_help=True)


def _secret(name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        raise ConfigError(f"{name} must be set (secrets come from the environment only)")
    return value


@engine_app.command("serve")
def engine_serve(
    ctx: typer.Context,
    model: str = typer.Option(
        "tiny-llama", "--model", help="Checkpoint directory, built-in tiny-* name, or (vllm) a Hugging Face model id."
    ),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    max_batch_size: int = typer.Option(32, "--max-batch-size", min=1),
    device: str = typer.Option("cpu", "--device", help="Local engine: cpu, cuda, cuda:N, mps, or auto (a GPU if any)."),
    dtype: str = typer.Option("auto", "--dtype", help="Local engine: auto, float32, bfloat16 or float16."),
    max_context: int | None = typer.Option(None, "--max-context", help="Prompt + completion limit (default: model's)."),
    reload: bool = typer.Option(False, "--reload/--no-reload", help="Follow policy-versions and hot-reload weights."),
    backend: str = typer.Option(
        "local",
        "--backend",
        help="local (Orchard's engine) or vllm (a shim in front of vLLM: pip install 'orchard-rl\\[vllm]').",
    ),
    vllm_url: str | None = typer.Option(
        None, "--vllm-url", help="With --backend vllm: attach to this running vLLM server instead of launching one."
    ),
    gpu_memory_utilization: float | None = typer.Option(
        None, "--gpu-memory-utilization", help="With --backend vllm (launched): fraction of GPU memory vLLM may take."
    ),
) -> None:
    """Serve a model over the OpenAI API with token traces (CPU or GPU; vLLM on a GPU)."""
    from orchard.engines.config import EngineConfig, serve_engine

    config = state(ctx).config()
    settings: dict[str, object] = {
        "type": backend, "model": model, "host": host, "port": port, "max_batch_size": max_batch_size,
        "device": device, "dtype": dtype, "policy_updates": {"enabled": reload},
    }  # fmt: skip
    if max_context is not None:
        settings["max_context"] = max_context
    vllm = {"url": vllm_url, "gpu_memory_utilization": gpu_memory_utilization}
    if any(value is not None for value in vllm.values()):
        settings["vllm"] = {key: value for key, value in vllm.items() if value is not None}
    try:
        engine = EngineConfig.model_validate(settings)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "engine options")) from exc
    serve_engine(engine, config)


@engine_app.command("scripted")
def engine_scripted(
    plan: Path = typer.Argument(..., exists=True, dir_okay=False, help="YAML/JSON plan of replies and tool calls."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    policy_version: int = typer.Option(0, "--policy-version", min=0),
) -> None:
    """Serve the scripted test backend: replays a fixed plan, with token traces."""
    from orchard.engines.scripted import serve_scripted

    serve_scripted(plan, host, port, policy_version)


@proxy_app.command("serve")
def proxy_serve(
    ctx: typer.Context,
    backend: str = typer.Option(..., "--backend", help="Base URL of the engine, e.g. http://127.0.0.1:8000/v1."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8100, "--port", min=1, max=65535),
) -> None:
    """Serve the recording proxy (admin token from ORCHARD_PROXY_ADMIN_TOKEN)."""
    from producers.proxy import ProxySettings
    from producers.proxy.server import serve_proxy

    config = state(ctx).config()
    try:
        settings = ProxySettings(backend_base_url=backend, run_id=config.run_id)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "proxy settings (ORCHARD_PROXY_*)")) from exc
    serve_proxy(settings, config, host, port)


@env_app.command("serve")
def env_serve(
    ctx: typer.Context,
    tasks: Path = typer.Option(..., "--tasks", exists=True, file_okay=False, help="Directory of task directories."),
    proxy: str = typer.Option(..., "--proxy", help="Base URL of the recording proxy, e.g. http://127.0.0.1:8100."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8200, "--port", min=1, max=65535),
    concurrency: int = typer.Option(8, "--concurrency", min=1),
    timeout_s: float = typer.Option(1800.0, "--timeout", min=1.0, help="Wall-clock limit per episode, seconds."),
    sandboxes: Path = typer.Option(Path(".orchard/sandboxes"), "--sandboxes", help="Local runtime root."),
) -> None:
    """Serve the episode service on the local runtime (ORCHARD_ENV_TOKEN, ORCHARD_PROXY_ADMIN_TOKEN required)."""
    import uvicorn

    from orchard.bus import open_bus
    from orchard.env.episode_runner import LocalEpisodeRunner, ProxyAdmin
    from orchard.env.local_runtime import LocalRuntime
    from orchard.env.scheduler import Scheduler
    from orchard.env.service import create_env_app
    from orchard.env.tasks import TaskCatalog

    config = state(ctx).config()
    token, admin_token = _secret("ORCHARD_ENV_TOKEN"), _secret("ORCHARD_PROXY_ADMIN_TOKEN")
    bus = open_bus(config.bus)
    # Sandboxes must not see the bus or the store (the harness binaries under .orchard/harnesses stay visible).
    hidden = [Path(config.bus.path).resolve()] if isinstance(config.bus, EmbeddedBusConfig) else []
    hidden += [Path(config.store.path).resolve()] if isinstance(config.store, LocalStoreConfig) else []
    harnesses = Path(".orchard/harnesses").resolve()  # infra/local/install_harnesses.sh puts Codex CLI there
    runtime = LocalRuntime(sandboxes, hidden_paths=hidden, shared_paths=[harnesses] if harnesses.is_dir() else [])
    runner = LocalEpisodeRunner(
        runtime=runtime, tasks=TaskCatalog(tasks), proxy=ProxyAdmin(proxy, admin_token), proxy_url=proxy,
        producer=bus.producer(), run_id=config.run_id,
    )  # fmt: skip
    app = create_env_app(Scheduler(runner, concurrency=concurrency, timeout_s=timeout_s), token)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        runtime.close()
        bus.close()
