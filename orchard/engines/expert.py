"""The expert backend: one OpenAI-compatible ASGI app serving a scripted plan per episode.

A recipe's scripted expert writes one ``ScriptedPlan`` per demonstration episode (``DIR/plans/<episode_id>.yaml``);
``ExpertBackend`` answers each request with the plan registered for the episode the recording proxy names in
``X-Orchard-Episode-Id``, each episode from its own first step (one ``create_scripted_app`` per episode). So
demonstrations run through the real harness, proxy, sandbox and grader, and are recorded exactly like RL episodes.

Run: ``orchard engine expert DIR [--port 8000] [--tokenizer tiny] [--policy-version 0] [--latency-s 0]`` serves every
plan under ``DIR/plans`` (``serve_expert``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import uvicorn

from orchard.engines.scripted import EPISODE_HEADER, ScriptedPlan, TraceTokenizer, create_scripted_app
from orchard.logging import get_logger

log = get_logger("engines.expert")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
DEFAULT_MODEL = "orchard-expert"
"""The model id ``/v1/models`` lists to a request that names no episode (a health check)."""
_EPISODE_HEADER = EPISODE_HEADER.encode()  # ASGI header names are lower-case bytes


class ExpertBackend:
    """An OpenAI-compatible ASGI app answering each episode's requests with the plan registered for that episode.

    Each registered episode gets its own scripted app (its own cursor); a request for an episode with no plan is
    answered 404, naming the episode, so a mis-wired run fails loudly instead of recording a silent "done".
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        policy_version: int = 0,
        tokenizer: TraceTokenizer | None = None,
        latency_s: float = 0.0,
    ) -> None:
        """``tokenizer``: report the policy's own token ids (so demonstrations can be trained on). ``latency_s``:
        answer each episode's request that long after it arrived, as a model would (a fault test needs episodes
        still running while it breaks something)."""
        if latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        self.model, self.policy_version, self.tokenizer, self.latency_s = model, policy_version, tokenizer, latency_s
        self._apps: dict[str, ASGIApp] = {}
        self._models: ASGIApp = create_scripted_app(ScriptedPlan(model=model), policy_version)

    def __len__(self) -> int:
        """Episodes with a plan."""
        return len(self._apps)

    def register(self, episode_id: str, plan: ScriptedPlan) -> None:
        """Answer ``episode_id``'s requests with ``plan`` (from its first step)."""
        self._apps[episode_id] = create_scripted_app(plan, self.policy_version, self.tokenizer)

    @classmethod
    def from_directory(
        cls,
        directory: Path,
        policy_version: int = 0,
        tokenizer: TraceTokenizer | None = None,
        latency_s: float = 0.0,
        model: str = DEFAULT_MODEL,
    ) -> ExpertBackend:
        """A backend serving every plan under ``directory/plans`` (``<episode_id>.yaml`` each)."""
        backend = cls(model=model, policy_version=policy_version, tokenizer=tokenizer, latency_s=latency_s)
        for path in sorted((directory / "plans").glob("*.yaml")):
            backend.register(path.stem, ScriptedPlan.from_file(path))
        return backend

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Dispatch by the episode header; lifespan events are acknowledged, ``/v1/models`` served to anyone."""
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        headers = dict(scope.get("headers") or [])
        episode_id = headers.get(_EPISODE_HEADER, b"").decode("latin-1")
        app = self._apps.get(episode_id)
        if app is None and scope.get("path") == "/v1/models":
            app = self._models
        if app is None:
            await _not_found(send, episode_id)
            return
        if self.latency_s and episode_id:
            await asyncio.sleep(self.latency_s)
        await app(scope, receive, send)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _not_found(send: Send, episode_id: str) -> None:
    message = f"no expert plan for episode {episode_id!r}" if episode_id else "no X-Orchard-Episode-Id header"
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": "unknown_episode"}})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 404, "headers": headers})
    await send({"type": "http.response.body", "body": body.encode()})


def serve_expert(
    directory: Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    policy_version: int = 0,
    tokenizer: str = "tiny",
    latency_s: float = 0.0,
    model: str = DEFAULT_MODEL,
) -> None:
    """Serve the plans under ``directory/plans`` until interrupted.

    ``tokenizer``: the policy's (``tiny`` or a tokenizer directory), so the recorded demonstrations carry token ids
    the policy can be trained on; ``none`` keeps the scripted backend's own byte tokens."""
    chat = None
    if tokenizer != "none":
        from orchard.datasets.conversation import ChatTokenizer  # loads the tokenizer stack only when asked for

        chat = ChatTokenizer.load(tokenizer)
    backend = ExpertBackend.from_directory(directory, policy_version, chat, latency_s, model)
    log.info("serving expert plans", plans=len(backend), host=host, port=port, latency_s=latency_s)
    uvicorn.run(backend, host=host, port=port, log_level="warning", lifespan="off", ws="none")
