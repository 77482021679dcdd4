"""Engine configs, in Orchard's typed config system (imports without torch): ``AnyEngineConfig``, keyed by ``type``.

``type`` picks the backend: ``local`` (Orchard's own engine, CPU or GPU) or ``vllm`` (an Orchard shim in front of a
vLLM OpenAI server that Orchard launches, or attaches to with ``vllm.url``; see ``orchard.engines.vllm_backend``),
both ``EngineConfig``, or ``scripted`` (``ScriptedEngineConfig``: replays a plan, for tests and demos).
``orchard.engines.factory.open_engine`` builds the engine a config names; ``orchard.engines.server.serve_engine``
serves it until interrupted, with hot reload of the ``policy-versions`` topic when ``policy_updates.enabled``.

.. code-block:: yaml

    model: tiny-llama            # or a checkpoint directory (or, for vllm, a Hugging Face model id)
    port: 8001
    max_batch_size: 32
    policy_updates: {enabled: true, model: policy}

    # the vLLM backend instead:
    type: vllm
    model: /models/Qwen2.5-0.5B-Instruct
    vllm: {gpu_memory_utilization: 0.8, tool_call_parser: hermes, extra_args: ["--enforce-eager"]}

    # the scripted backend:
    type: scripted
    plan: plan.yaml
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchard.config import DEFAULT_HOME, default_type


class PolicyUpdatesConfig(BaseModel):
    """Hot reload: follow ``policy-versions`` and serve each new version of one model of this run."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Subscribe to the policy-versions topic and reload new weights.")
    model: str = Field(
        "policy", min_length=1, description="The PolicyVersion.model to follow (records of others are ignored)."
    )
    run_id: str | None = Field(None, description="The run to follow; default: the Orchard config's run_id.")
    catch_up: bool = Field(True, description="At start, load the newest version already in the store if it is newer.")
    max_version: int | None = Field(
        None,
        ge=0,
        description="Serve no version above this one: a frozen earlier policy (a distillation teacher, a reference). "
        "The newest stored version <= it is installed before the engine answers; with none, the engine fails to "
        "start.",
    )
    download_dir: Path | None = Field(
        None, description="Where versions are downloaded (a temporary directory if unset)."
    )
    poll_timeout_s: float = Field(0.5, gt=0, le=10, description="Longest wait of one poll of the topic.")


# vLLM options Orchard passes itself; in ``extra_args`` they would contradict the config (or break hot reload).
_MANAGED_VLLM_FLAGS = (
    "--host", "--port", "--served-model-name", "--gpu-memory-utilization", "--dtype", "--max-model-len",
    "--tensor-parallel-size", "--worker-extension-cls", "--tool-call-parser", "--enable-auto-tool-choice",
)  # fmt: skip
# Only meaningful when Orchard starts vLLM; with ``url`` set they would be silently ignored, so they are refused.
_LAUNCH_ONLY_FIELDS = (
    "executable", "port", "gpu_memory_utilization", "tensor_parallel_size", "tool_call_parser", "extra_args",
    "startup_timeout_s",
)  # fmt: skip


class VLLMConfig(BaseModel):
    """The vLLM backend: attach to a running vLLM OpenAI server (``url``), or launch one (``url`` unset)."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(
        None,
        pattern=r"^https?://[^/\s]+/?$",
        description="Base URL of a running vLLM server to attach to (http://host:port, no /v1); unset: launch one. "
        "Hot reload needs it started with VLLM_SERVER_DEV_MODE=1 and "
        "--worker-extension-cls orchard.engines.vllm_worker.OrchardWorkerExtension.",
    )
    executable: str = Field("vllm", min_length=1, description="The vLLM command to launch (``vllm serve ...``).")
    port: int = Field(0, ge=0, le=65535, description="Port of the launched vLLM server (0: any free port).")
    gpu_memory_utilization: float = Field(
        0.85, gt=0, le=1, description="Fraction of GPU memory vLLM may take (weights, activations, KV cache)."
    )
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs the launched model is sharded over.")
    tool_call_parser: str | None = Field(
        "hermes",
        min_length=1,
        description="vLLM tool-call parser (hermes reads the <tool_call> blocks of Qwen-style and tiny models); "
        "None: tools are rendered but calls are not parsed.",
    )
    extra_args: list[str] = Field(
        default_factory=list, description="More ``vllm serve`` arguments, e.g. ['--enforce-eager']."
    )
    startup_timeout_s: float = Field(900.0, gt=0, description="Longest wait for a launched vLLM to become healthy.")
    request_timeout_s: float = Field(600.0, gt=0, description="Longest wait for one vLLM response (or stream read).")
    drain_timeout_s: float = Field(
        300.0,
        gt=0,
        description="Longest wait for in-flight requests to finish before a weight swap; past it the new version "
        "is refused and the old one keeps serving.",
    )
    reload_timeout_s: float = Field(600.0, gt=0, description="Longest wait for vLLM to load a new version's weights.")

    @model_validator(mode="after")
    def _consistent(self) -> VLLMConfig:
        managed = [a for a in self.extra_args if a.split("=", 1)[0] in _MANAGED_VLLM_FLAGS]
        if managed:
            raise ValueError(f"extra_args: {managed} are set by Orchard from the engine config; use those fields")
        if self.url is not None:
            launch_only = sorted(set(_LAUNCH_ONLY_FIELDS) & self.model_fields_set)
            if launch_only:
                raise ValueError(f"{', '.join(launch_only)}: only apply when Orchard launches vLLM, but url is set")
        return self


class EngineConfig(BaseModel):
    """An inference engine: which checkpoint, where it listens, how it batches, hot reload, and which backend."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["local", "vllm"] = Field(
        "local", description="Engine backend: Orchard's local engine, or vLLM behind an Orchard shim."
    )
    model: str = Field(
        "tiny-llama",
        min_length=1,
        description="Checkpoint directory, or a tiny-family name (tiny-llama); for vllm also a Hugging Face id.",
    )
    served_model_name: str | None = Field(None, description="Model id of the API; default: the model's last path part.")
    tiny_seed: int = Field(0, ge=0, description="Seed the weights of a tiny-family model are built from.")
    cache_dir: Path = Field(DEFAULT_HOME / "models", description="Where tiny-family checkpoints are built.")
    host: str = Field("127.0.0.1", min_length=1, description="Interface to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="Port to listen on (0: any free port).")
    max_batch_size: int = Field(32, ge=1, le=4096, description="Most sequences generated together in one step.")
    max_queue: int = Field(256, ge=0, description="Most requests waiting for a batch slot; beyond it, HTTP 503.")
    prefix_cache_mb: int = Field(
        256,
        ge=0,
        description="Local engine: MiB of finished sequences' keys and values kept for later prompts that start the"
        " same way to reuse instead of prefilling them (orchard/engines/prefix_cache.py); 0 turns the cache off.",
    )
    max_context: int | None = Field(None, ge=8, description="Prompt + completion limit; default: the model's own.")
    default_max_tokens: int = Field(256, ge=1, description="Completion length when a request gives none.")
    device: str = Field(
        "cpu", pattern=r"^(auto|cpu|cuda(:\d+)?|mps)$", description="Torch device ('auto': GPU if any)."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights' dtype ('auto': bfloat16 on a GPU, float32 on the CPU)."
    )
    cpu_threads: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="torch intra-op threads on a CPU (process-wide); default: torch's. 1 suits tiny models on a "
        "shared machine (OpenMP threads that lose their core stall every op).",
    )
    policy_version: int = Field(0, ge=0, description="Policy version the checkpoint itself is.")
    policy_updates: PolicyUpdatesConfig = Field(default_factory=PolicyUpdatesConfig)
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="The vLLM backend (type: vllm only).")

    @model_validator(mode="after")
    def _backend_options(self) -> EngineConfig:
        if self.type == "local" and "vllm" in self.model_fields_set:
            raise ValueError("vllm: settings given, but type is 'local' (set type: vllm to use them)")
        if self.type == "vllm" and self.policy_updates.max_version is not None:
            raise ValueError("policy_updates.max_version: only the local engine serves a pinned version")
        return self


class ScriptedEngineConfig(BaseModel):
    """The scripted backend: replays a plan of replies and tool calls, with token traces (no model, no reload)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["scripted"] = "scripted"
    plan: Path = Field(..., description="YAML/JSON plan of replies and tool calls (orchard.engines.scripted).")
    host: str = Field("127.0.0.1", min_length=1, description="Interface to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="Port to listen on (0: any free port).")
    policy_version: int = Field(0, ge=0, description="Policy version every answer's token trace reports.")


AnyEngineConfig = Annotated[
    EngineConfig | ScriptedEngineConfig,
    Field(discriminator="type"),
    default_type(EngineConfig, ScriptedEngineConfig),
]
"""Any engine's config: ``type`` is ``local`` (the default) or ``vllm`` (``EngineConfig``), or ``scripted``."""
