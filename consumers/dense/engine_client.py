"""A small synchronous client of an OpenAI-compatible engine's legacy ``/v1/completions``, used to score token
sequences (``echo: true, logprobs: 0``), and a helper that scores a trajectory's steps in parallel.

The request is the one vLLM and Orchard's local engine both accept: ``prompt`` as token ids or text (a batch of
them), ``echo``, ``logprobs: 0``, ``max_tokens`` 0 or 1 (``EngineSettings.echo_max_tokens``: vLLM always
generates at least one token, which is then ignored) and ``return_tokens_as_token_ids`` (so the echoed tokens can
be checked against what was sent). Requests refused with 429/503 (``Retry-After``) or that cannot connect are
retried ``max_retries`` times with a short backoff; every failure raises a ``DenseRewardError`` subclass whose
message starts with ``where`` (the episode and call).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from consumers.dense.exceptions import EngineAnswerError, EngineUnreachableError, TokenMismatchError
from consumers.dense.settings import EngineSettings
from consumers.rewards import Score, StepResult, normalise_step_result
from orchard.trajectory import Step, Trajectory

RETRY_STATUSES = frozenset({429, 502, 503, 504})
BACKOFF_S = 0.5
TOKEN_ID_PREFIX = "token_id:"  # noqa: S105 - a token-name prefix, not a password


@dataclass(frozen=True, slots=True)
class EchoedSequence:
    """An engine's scoring of one prompt: the echoed tokens' logprobs (first ``None``), generated tail removed.

    ``token_ids`` is None when the engine did not return tokens as ids.
    """

    logprobs: list[float | None]
    token_ids: list[int] | None


class EngineClient:
    """Scores token sequences or texts with one model of one engine (thread-safe: one HTTP client, many threads)."""

    def __init__(self, base_url: str, model: str, settings: EngineSettings) -> None:
        """Talk to ``model`` at ``base_url`` (``http://host:port`` or ``http://host:port/v1``)."""
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.settings = settings
        headers = {"Authorization": f"Bearer {settings.api_key.get_secret_value()}"} if settings.api_key else {}
        self._http = httpx.Client(base_url=self.base_url, timeout=settings.timeout_s, headers=headers)

    def close(self) -> None:
        """Close the HTTP connections."""
        self._http.close()

    def echo(self, prompts: Sequence[Sequence[int] | str], where: str) -> list[EchoedSequence]:
        """Each prompt's token logprobs as the engine scores them (one request for the batch)."""
        body = {
            "model": self.model,
            "prompt": [p if isinstance(p, str) else [int(t) for t in p] for p in prompts],
            "echo": True,
            "logprobs": 0,
            "max_tokens": self.settings.echo_max_tokens,
            "temperature": 1.0,
            "return_tokens_as_token_ids": True,
        }
        answer = self._post("/v1/completions", body, where)
        choices = answer.get("choices")
        if not isinstance(choices, list) or len(choices) != len(prompts):
            count = len(choices) if isinstance(choices, list) else 0
            raise TokenMismatchError(f"{where}: sent {len(prompts)} prompts to {self.base_url}, got {count} choices")
        ordered = sorted(choices, key=lambda choice: int(choice.get("index", 0)))
        return [self._echoed(choice, where) for choice in ordered]

    def _echoed(self, choice: dict[str, Any], where: str) -> EchoedSequence:
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        tokens = (choice.get("logprobs") or {}).get("tokens") or []
        if not isinstance(logprobs, list) or len(logprobs) < self.settings.echo_max_tokens:
            raise EngineAnswerError(f"{where}: the engine at {self.base_url} returned no logprobs.token_logprobs")
        # max_tokens 0 generates nothing; max_tokens 1 generates exactly one token (an end of sequence included)
        echoed = len(logprobs) - self.settings.echo_max_tokens
        ids = [_token_id(t) for t in tokens[:echoed]]
        exact = len(ids) == echoed and all(i is not None for i in ids)
        return EchoedSequence(logprobs[:echoed], [int(i) for i in ids if i is not None] if exact else None)

    def _post(self, path: str, body: dict[str, Any], where: str) -> dict[str, Any]:
        for attempt in range(self.settings.max_retries + 1):
            last = attempt == self.settings.max_retries
            try:
                response = self._http.post(path, json=body)
            except httpx.TransportError as exc:
                if last:
                    raise EngineUnreachableError(
                        f"{where}: the engine at {self.base_url} is unreachable ({type(exc).__name__}: {exc})"
                    ) from exc
                time.sleep(BACKOFF_S * (attempt + 1))
                continue
            if response.status_code in RETRY_STATUSES and not last:
                time.sleep(_retry_after(response, BACKOFF_S * (attempt + 1)))
                continue
            return _json_answer(response, self.base_url, where)
        raise AssertionError("unreachable")  # the loop returns or raises on its last attempt


def _json_answer(response: httpx.Response, base_url: str, where: str) -> dict[str, Any]:
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if response.status_code != 200:
        message = (payload or {}).get("error", {}).get("message") if isinstance(payload, dict) else None
        raise EngineAnswerError(
            f"{where}: the engine at {base_url} answered HTTP {response.status_code}: {message or response.text[:500]}"
        )
    if not isinstance(payload, dict):
        raise EngineAnswerError(f"{where}: the engine at {base_url} answered a body that is not a JSON object")
    return payload


def _retry_after(response: httpx.Response, default: float) -> float:
    try:
        return min(float(response.headers.get("Retry-After", default)), 30.0)
    except ValueError:
        return default


def _token_id(token: Any) -> int | None:
    if isinstance(token, str) and token.startswith(TOKEN_ID_PREFIX):
        try:
            return int(token.removeprefix(TOKEN_ID_PREFIX))
        except ValueError:
            return None
    return None


def where(trajectory: Trajectory, step: Step) -> str:
    """How errors name a step: ``episode E call N``."""
    return f"episode {trajectory.episode_id} call {step.call_index}"


def score_steps_concurrently(
    score_step: Callable[[Step, Trajectory], StepResult], trajectory: Trajectory, workers: int
) -> list[Score]:
    """Every step through ``score_step``, ``workers`` at a time; scores in step order. The first error raises."""
    if workers <= 1 or len(trajectory.steps) <= 1:
        results = [score_step(step, trajectory) for step in trajectory.steps]
    else:
        with ThreadPoolExecutor(max_workers=min(workers, len(trajectory.steps))) as pool:
            results = list(pool.map(lambda step: score_step(step, trajectory), trajectory.steps))
    pairs = zip(trajectory.steps, results, strict=True)
    return [score for step, result in pairs for score in normalise_step_result(step, result)]
