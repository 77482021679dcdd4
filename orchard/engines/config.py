"""``EngineConfig``: how an inference engine is started, in Orchard's typed config system (imports without torch).

``serve_engine(config, orchard_config)`` runs the local engine's OpenAI server until interrupted, with hot reload
of the ``policy-versions`` topic when ``config.policy_updates.enabled``; ``orchard engine serve`` calls it. The
heavy modules (torch, transformers) are imported only inside it.

.. code-block:: yaml

    model: tiny-llama            # or a checkpoint directory
    port: 8001
    max_batch_size: 32
    policy_updates: {enabled: true, model: policy}
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchard.config import DEFAULT_HOME

if TYPE_CHECKING:
    from orchard.config import OrchardConfig


class PolicyUpdatesConfig(BaseModel):
    """Hot reload: follow ``policy-versions`` and serve each new version of one model of this run."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Subscribe to the policy-versions topic and reload new weights.")
    model: str = Field(
        "policy", min_length=1, description="The PolicyVersion.model to follow (records of others are ignored)."
    )
    run_id: str | None = Field(None, description="The run to follow; default: the Orchard config's run_id.")
    catch_up: bool = Field(True, description="At start, load the newest version already in the store if it is newer.")
    download_dir: Path | None = Field(
        None, description="Where versions are downloaded (a temporary directory if unset)."
    )
    poll_timeout_s: float = Field(0.5, gt=0, le=10, description="Longest wait of one poll of the topic.")


class EngineConfig(BaseModel):
    """The local inference engine: which checkpoint, where it listens, how it batches, and hot reload."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["local"] = Field("local", description="Engine backend.")
    model: str = Field(
        "tiny-llama", min_length=1, description="Checkpoint directory, or a tiny-family name (tiny-llama)."
    )
    served_model_name: str | None = Field(None, description="Model id of the API; default: the model's last path part.")
    tiny_seed: int = Field(0, ge=0, description="Seed the weights of a tiny-family model are built from.")
    cache_dir: Path = Field(DEFAULT_HOME / "models", description="Where tiny-family checkpoints are built.")
    host: str = Field("127.0.0.1", min_length=1, description="Interface to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="Port to listen on (0: any free port).")
    max_batch_size: int = Field(32, ge=1, le=4096, description="Most sequences generated together in one step.")
    max_queue: int = Field(256, ge=0, description="Most requests waiting for a batch slot; beyond it, HTTP 503.")
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


def serve_engine(config: EngineConfig, orchard_config: OrchardConfig) -> None:
    """Serve ``config``'s model over the OpenAI API until interrupted (blocking); reload weights if configured."""
    import uvicorn

    from orchard.engines.local import LocalEngine
    from orchard.engines.openai_api import create_engine_app
    from orchard.engines.reload import open_reloader
    from orchard.logging import get_logger

    engine = LocalEngine.from_config(config)
    reloader = open_reloader(engine, config.policy_updates, orchard_config) if config.policy_updates.enabled else None
    app = create_engine_app(engine, reloader=reloader)
    get_logger("engines").info("engine serving", host=config.host, port=config.port, model=engine.model_name)
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning", ws="none")
