"""Settings of the recording proxy: where the backend is, limits, topics, and the admin secret.

Secrets (the admin token, the backend API key) come from the environment: ``ORCHARD_PROXY_ADMIN_TOKEN``,
``ORCHARD_PROXY_BACKEND_API_KEY``; every field can be set as ``ORCHARD_PROXY_<FIELD>``.
"""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from orchard.topics import MODEL_CALLS, OUTCOMES


class ProxySettings(BaseSettings):
    """Everything the recording proxy needs besides the bus."""

    model_config = SettingsConfigDict(env_prefix="ORCHARD_PROXY_", extra="forbid")

    backend_base_url: str = Field(
        ..., pattern=r"^https?://", description="OpenAI base URL of the inference backend, e.g. http://vllm:8000/v1."
    )
    backend_api_key: SecretStr | None = Field(None, description="Bearer token the backend expects (None: no auth).")
    admin_token: SecretStr = Field(..., description="Bearer token of the admin routes (the Env's secret).")
    run_id: str = Field("default", min_length=1, pattern=r"^[A-Za-z0-9._-]+$", description="Run of every record.")
    model_calls_topic: str = Field(MODEL_CALLS, min_length=1, description="Topic ModelCalls are published to.")
    outcomes_topic: str = Field(OUTCOMES, min_length=1, description="Topic of outcomes (published by the Env).")
    request_timeout_s: float = Field(
        600.0, gt=0, description="Longest wait for a non-streamed answer, or between two chunks of a stream."
    )
    connect_timeout_s: float = Field(10.0, gt=0, description="Longest wait to connect to the backend.")
    max_request_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="Largest request body accepted (413).")
    max_backend_connections: int = Field(1024, ge=1, description="Connections to the backend held at most.")
    flush_interval_s: float = Field(
        0.05, gt=0, le=60, description="How often recorded calls are flushed to the bus in the background."
    )
    flush_timeout_s: float = Field(30.0, gt=0, description="Longest wait for the bus to acknowledge a flush.")
    drain_timeout_s: float = Field(
        60.0, ge=0, description="Closing an episode waits this long for its in-flight calls; later ones are dropped."
    )
    max_ttl_s: float = Field(7 * 24 * 3600.0, gt=0, description="Longest token lifetime an episode may ask for.")
    expired_grace_s: float = Field(
        3600.0, ge=0, description="An expired episode never closed by the Env is closed this long after expiry."
    )
    closed_episodes_kept: int = Field(10_000, ge=0, description="Summaries of closed episodes kept for lookups.")
    max_conversations: int = Field(64, ge=1, description="Conversations per episode tracked for lineage.")

    @field_validator("admin_token")
    @classmethod
    def _strong_enough(cls, value: SecretStr) -> SecretStr:
        if len(value.get_secret_value()) < 16:
            raise ValueError("admin_token must be at least 16 characters")
        return value
