"""``orchard engine serve|scripted``, ``orchard proxy serve`` and ``orchard env serve``: each component alone."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

import typer
from pydantic import ValidationError

from orchard.cli.common import state
from orchard.config import EmbeddedBusConfig, LocalStoreConfig, OrchardConfig, describe_validation_error
from orchard.exceptions import ConfigError
from orchard.logging import get_logger
from orchard.sandbox import Runtime

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
    served_model_name: str | None = typer.Option(
        None, "--served-model-name", help="Model id of the API (default: the model's last path part)."
    ),
    default_max_tokens: int | None = typer.Option(
        None, "--default-max-tokens", min=1, help="Local engine: completion length of a request giving none (256)."
    ),
    reload: bool = typer.Option(False, "--reload/--no-reload", help="Follow policy-versions and hot-reload weights."),
    cpu_threads: int | None = typer.Option(
        None,
        "--cpu-threads",
        min=1,
        help="Local engine on a CPU: torch threads (default: torch's, one per core). 1 suits a tiny model sharing "
        "the cores with a trainer.",
    ),
    max_version: int | None = typer.Option(
        None, "--max-version", min=0, help="With --reload: serve no newer version (a frozen teacher or reference)."
    ),
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
    from orchard.engines.config import EngineConfig
    from orchard.engines.server import serve_engine

    config = state(ctx).config()
    settings: dict[str, object] = {
        "type": backend, "model": model, "host": host, "port": port, "max_batch_size": max_batch_size,
        "device": device, "dtype": dtype, "policy_updates": {"enabled": reload, "max_version": max_version},
    }  # fmt: skip
    if max_version is not None and not reload:
        raise ConfigError("--max-version needs --reload (it limits the versions followed)")
    if max_context is not None:
        settings["max_context"] = max_context
    if served_model_name is not None:
        settings["served_model_name"] = served_model_name
    if default_max_tokens is not None:
        settings["default_max_tokens"] = default_max_tokens
    if cpu_threads is not None:
        settings["cpu_threads"] = cpu_threads
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
    from orchard.engines.config import ScriptedEngineConfig
    from orchard.engines.server import serve_engine

    serve_engine(ScriptedEngineConfig(plan=plan, host=host, port=port, policy_version=policy_version))


@engine_app.command("expert")
def engine_expert(
    directory: Path = typer.Argument(..., help="A scripted expert's output: one plan per episode under plans/."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    policy_version: int = typer.Option(0, "--policy-version", min=0),
    tokenizer: str = typer.Option("tiny", "--tokenizer", help="The policy's tokenizer: tiny, a directory, or none."),
    latency_s: float = typer.Option(
        0.0, "--latency-s", min=0.0, help="Answer each episode's request this many seconds after it arrived."
    ),
    model: str | None = typer.Option(None, "--model", help="Model id /v1/models lists to a request naming no episode."),
) -> None:
    """Serve a scripted expert's plans, each to the episode the recording proxy names (X-Orchard-Episode-Id)."""
    from orchard.engines.expert import DEFAULT_MODEL, serve_expert

    serve_expert(directory, host, port, policy_version, tokenizer, latency_s, model or DEFAULT_MODEL)


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


def sandbox_hidden_paths(config: OrchardConfig, tasks: Path, extra: Sequence[Path] = ()) -> list[Path]:
    """What the Env's sandboxes must never see: the embedded bus and the local store (every run's records and weights),
    the task directories (graders, hidden tests) and ``extra``. A sandbox sees only an allow-list of the machine anyway
    (``orchard.sandbox.local.sandbox_view``); these are checked against it, so a shared directory that would show one of
    them is refused at start. The harness installations under .orchard/harnesses are shared."""
    hidden = [Path(config.bus.path)] if isinstance(config.bus, EmbeddedBusConfig) else []
    hidden += [Path(config.store.path)] if isinstance(config.store, LocalStoreConfig) else []
    missing = [str(path) for path in extra if not Path(path).exists()]
    if missing:
        raise ConfigError(f"--hide: no such path {', '.join(missing)}")
    return list(dict.fromkeys(path.resolve() for path in [*hidden, tasks, *extra]))


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
    hide: list[Path] = typer.Option(
        [],
        "--hide",
        help="Another directory sandboxes must never see (repeatable; sandboxes see an allow-list of "
        "the machine, and a share that would show it is refused), e.g. a suite's reference fixes.",
    ),
    runtime_kind: str = typer.Option(
        "local", "--runtime", help="local (process trees on this machine) or kubernetes (a pod per episode)."
    ),
    runtime_config: Path | None = typer.Option(
        None,
        "--runtime-config",
        exists=True,
        dir_okay=False,
        help="KubernetesRuntimeConfig YAML (kubernetes).",
    ),
    reap_interval_s: float = typer.Option(
        60.0, "--reap-interval", min=1.0, help="Kubernetes: how often pods past their lifetime are deleted, seconds."
    ),
) -> None:
    """Serve the episode service on the local runtime (ORCHARD_ENV_TOKEN, ORCHARD_PROXY_ADMIN_TOKEN required).

    Sandboxes never see the bus, the store, the task directories (hidden tests, graders) or the ``--hide`` paths."""
    import uvicorn

    from orchard.bus import open_bus
    from orchard.env.episode_runner import LocalEpisodeRunner, ProxyAdmin
    from orchard.env.scheduler import Scheduler
    from orchard.env.service import create_env_app
    from orchard.env.tasks import TaskCatalog

    config = state(ctx).config()
    token, admin_token = _secret("ORCHARD_ENV_TOKEN"), _secret("ORCHARD_PROXY_ADMIN_TOKEN")
    runtime = _episode_runtime(runtime_kind, runtime_config, config, tasks, hide, sandboxes)
    bus = open_bus(config.bus)
    runner = LocalEpisodeRunner(
        runtime=runtime, tasks=TaskCatalog(tasks), proxy=ProxyAdmin(proxy, admin_token), proxy_url=proxy,
        producer=bus.producer(), run_id=config.run_id,
    )  # fmt: skip
    app = create_env_app(Scheduler(runner, concurrency=concurrency, timeout_s=timeout_s), token)
    reaper = _Reaper(runtime, reap_interval_s) if runtime_kind == "kubernetes" else None
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        if reaper is not None:
            reaper.stop()
        runtime.close()
        bus.close()


def _episode_runtime(
    kind: str, runtime_config: Path | None, config: OrchardConfig, tasks: Path, hide: Sequence[Path], sandboxes: Path
) -> Runtime:
    """The runtime ``orchard env serve`` runs episodes on (``orchard.sandbox.factory.open_runtime``)."""
    from orchard.sandbox.factory import (
        RUNTIME_TYPES,
        LocalRuntimeConfig,
        RuntimeConfig,
        open_runtime,
        read_runtime_config,
    )

    if kind not in RUNTIME_TYPES:
        raise ConfigError(f"--runtime: {kind!r} is neither local nor kubernetes")
    if kind == "local":
        if runtime_config is not None:
            raise ConfigError("--runtime-config is for --runtime kubernetes; the local runtime takes no file")
        harnesses = Path(".orchard/harnesses").resolve()  # infra/local/install_harnesses.sh puts Codex CLI there
        hidden = sandbox_hidden_paths(config, tasks, hide)
        shared = [harnesses] if harnesses.is_dir() else []
        return open_runtime(LocalRuntimeConfig(), sandboxes=sandboxes, hidden_paths=hidden, shared_paths=shared)
    if hide:
        raise ConfigError("--hide is for the local runtime (episode pods never see this machine's files)")
    if runtime_config is None:
        raise ConfigError("--runtime kubernetes needs --runtime-config FILE (a KubernetesRuntimeConfig in YAML)")
    settings: RuntimeConfig = read_runtime_config(runtime_config, kind)
    runtime = open_runtime(settings, sandboxes=sandboxes)
    from orchard.sandbox.kubernetes.runtime import KubernetesRuntime, KubernetesRuntimeError

    if isinstance(runtime, KubernetesRuntime):  # fail at start, naming what the credentials lack
        try:
            runtime.check_rights()
        except KubernetesRuntimeError as exc:
            runtime.close()
            raise ConfigError(f"--runtime kubernetes: {exc}") from exc
    return runtime


class _Reaper:
    """Deletes episode pods past their lifetime every ``interval_s`` (pods outlive a crashed Env otherwise)."""

    def __init__(self, runtime: Runtime, interval_s: float) -> None:
        self._runtime, self._interval_s = runtime, interval_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orchard-reaper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            try:
                self._runtime.reap_expired()
            except Exception:  # noqa: BLE001 - the API server may be briefly away; try again next time
                get_logger("orchard.env").exception("reaping expired sandboxes failed")

    def stop(self) -> None:
        """Stop reaping (the current pass finishes first)."""
        self._stopping.set()
        self._thread.join(timeout=60)
