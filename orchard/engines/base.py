"""The engine interface: what serving an engine and reloading its weights need, whatever the backend.

Three backends implement it: ``local`` (``orchard.engines.local.LocalEngine``: Orchard's own engine), ``vllm``
(``orchard.engines.vllm_backend.VLLMBackend``: a shim in front of vLLM) and ``scripted``
(``orchard.engines.scripted_engine.ScriptedEngine``: replays a plan, for tests and demos). ``open_engine``
(``orchard.engines.factory``) builds one from its config; ``serve_engine`` (``orchard.engines.server``, what
``orchard engine serve|scripted`` runs) serves its app; the reloader (``orchard.engines.reload``) calls
``load_version``. Clients (the recording proxy, harnesses) see the engine only over HTTP: the OpenAI API with a token
trace on every answer (``orchard.engines.token_trace``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

    from orchard.engines.reload import PolicyReloader


class Engine(ABC):
    """A model served over Orchard's OpenAI API, at one policy version at a time."""

    #: whether ``load_version_files`` loads from memory (the reloader then reads small versions into memory);
    #: otherwise the reloader downloads each version into its download directory for ``load_version``
    loads_from_memory: bool = False

    @property
    @abstractmethod
    def model_name(self) -> str:
        """The model id of the API (``/v1/models``; the ``model`` requests name)."""

    @property
    @abstractmethod
    def policy_version(self) -> int:
        """The policy version new requests are served with (0: the starting weights)."""

    @abstractmethod
    def load_version(self, directory: Path, version: int) -> None:
        """Serve the verified weights in ``directory`` as ``version`` (requests in flight finish on the old ones);
        raise, and keep serving the old version, if they cannot be served."""

    def load_version_files(self, files: Mapping[str, bytes], version: int) -> bool:
        """Serve a verified version held in memory (its file paths and contents) as ``version``, like
        ``load_version``; False if this engine cannot take this version from memory (the caller then hands it over
        in a directory). This default takes none; the local engine takes a single-file safetensors version of the
        served architecture (``loads_from_memory``)."""
        return False

    @abstractmethod
    def create_app(self, reloader: PolicyReloader | None = None) -> FastAPI:
        """The HTTP app serving this engine: running it starts the engine (and ``reloader``), stopping it stops them."""

    @abstractmethod
    def close(self) -> None:
        """Release what opening the engine started (the local engine's worker, a vLLM server Orchard launched);
        idempotent, and called after the app stopped too."""
