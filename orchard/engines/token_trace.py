"""The token-trace contract: how an engine tells the proxy exactly which tokens it saw and sampled.

Every Orchard engine (the local engine, the vLLM backend, the scripted test backend) answers an OpenAI request
with one extra top-level field, ``"orchard"``, holding the engine's own token ids and logprobs, so the proxy
records them without ever re-tokenizing text:

.. code-block:: json

    {"orchard": {"prompt_token_ids": [1, 2, 3], "completion_token_ids": [7, 8],
                 "completion_logprobs": [-0.1, -2.3], "policy_version": 4}}

Where it goes:

- ``/v1/chat/completions``, not streamed: top level of the completion object (for ``n > 1``, each choice
  carries its own ``"orchard"`` object instead and the top-level one is absent);
- ``/v1/chat/completions``, streamed: top level of the last chunk before ``data: [DONE]``;
- ``/v1/responses``, not streamed: top level of the response object;
- ``/v1/responses``, streamed: inside the ``response`` of the ``response.completed`` event.

``completion_logprobs`` has one entry per completion token. A streamed response carries exactly the same trace
as its non-streamed equivalent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

TRACE_FIELD = "orchard"


class TokenTrace(BaseModel):
    """The engine's own tokens for one completion."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_token_ids: list[int] = Field(description="Token ids of the prompt, as the engine rendered it.")
    completion_token_ids: list[int] = Field(description="Token ids the engine sampled.")
    completion_logprobs: list[float] = Field(description="Logprob of each sampled token under the serving policy.")
    policy_version: int = Field(ge=0, description="Policy version whose weights produced the completion.")

    @model_validator(mode="after")
    def _one_logprob_per_token(self) -> TokenTrace:
        if len(self.completion_logprobs) != len(self.completion_token_ids):
            raise ValueError(
                f"{len(self.completion_logprobs)} logprobs for {len(self.completion_token_ids)} completion tokens"
            )
        return self

    def as_field(self) -> dict[str, Any]:
        """The ``{"orchard": {...}}`` fragment an engine adds to its response."""
        return {TRACE_FIELD: self.model_dump()}


def trace_of(payload: Mapping[str, Any]) -> TokenTrace | None:
    """The trace in a response object, chunk, or choice; None if it carries none."""
    raw = payload.get(TRACE_FIELD)
    return None if raw is None else TokenTrace.model_validate(raw)
