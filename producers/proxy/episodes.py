"""Episodes the proxy serves: per-episode tokens, recorders, lineage and ordering, and closing with bus confirmation.

The Env opens an episode (``POST /admin/episodes``) and hands the returned token to the harness as its API key. Every
call made with the token is recorded for that episode. Closing it (``DELETE``) revokes the token, waits for calls in
flight (up to ``drain_timeout_s``; any later one is dropped, never recorded), flushes the bus and answers only once
every recorded call is acknowledged, so the outcome the Env publishes next never refers to calls that can be lost.
If a call failed to publish or was not acknowledged, closing answers ``RecordingIncompleteError`` (and may be
retried). Delivery callbacks (``acked``, ``delivery_failed``) run on the bus writer thread; everything else,
recording included, on the event loop.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from orchard.bus.base import Delivery
from orchard.codec import Codec
from orchard.episode_recorder import EpisodeRecorder
from orchard.logging import get_logger
from producers.proxy.bus_writer import BusWriter
from producers.proxy.canonical import SampledTurns
from producers.proxy.completion import Completion
from producers.proxy.exceptions import AuthenticationError, ConflictError, NotFoundError, RecordingIncompleteError
from producers.proxy.images import ImageRecorder
from producers.proxy.lineage import ConversationTracker
from producers.proxy.request import ModelRequest, with_messages
from producers.proxy.sequencer import CallSequencer
from producers.proxy.settings import ProxySettings

log = get_logger("proxy.episodes")

EpisodeState = Literal["active", "expired", "closing", "closed"]
Unrecorded = Literal["abandoned", "refused", "backend_failed"]
"""Why an accepted call was not answered with something to record: the harness went away (closed its connection)
before the answer was complete; the backend refused it (4xx); the backend failed (5xx, a timeout, unreachable, no
valid token trace)."""


class EpisodeSpec(BaseModel):
    """What the Env registers: the episode's identity and how long its token lives."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    episode_id: str = Field(pattern=r"^[A-Za-z0-9._:-]{1,200}$", description="Unique episode id.")
    task_id: str = Field(min_length=1, max_length=500, description="Task the episode attempts.")
    harness: str = Field(min_length=1, max_length=100, description="Harness name recorded with every call.")
    model: str = Field(min_length=1, max_length=500, description="Model name the harness is configured with.")
    ttl_s: float = Field(gt=0, description="Lifetime of the token, seconds.")


class EpisodeGrant(BaseModel):
    """The token a harness uses as its API key, and when it expires."""

    episode_id: str
    token: str
    expires_at: int = Field(description="UTC milliseconds since the epoch.")


class EpisodeSummary(BaseModel):
    """An episode's state and call counts. Every call received is in exactly one count::

        calls_received = calls_recorded + calls_pending + calls_failed + calls_dropped
                       + calls_abandoned + calls_refused + calls_backend_failed + calls_in_flight

    (a request answered with ``n`` choices counts ``n`` times in ``calls_received``, once it is answered).
    """

    episode_id: str
    task_id: str
    harness: str
    model: str
    state: EpisodeState
    expires_at: int = Field(description="UTC milliseconds since the epoch.")
    calls_received: int = Field(
        description="Model calls accepted with the episode's token: one per request, one per choice once answered."
    )
    calls_in_flight: int = Field(description="Requests not yet answered and recorded (or given up).")
    calls_recorded: int = Field(description="ModelCalls acknowledged by the bus.")
    calls_pending: int = Field(description="ModelCalls produced, not yet acknowledged.")
    calls_failed: int = Field(description="Answered calls that failed to publish, or the bus did not deliver.")
    calls_dropped: int = Field(description="Answered calls not recorded because the episode was closing.")
    calls_abandoned: int = Field(
        0, description="Calls the harness hung up on (closed its connection) before their answer was complete."
    )
    calls_refused: int = Field(0, description="Calls the backend refused (a 4xx, passed on to the harness).")
    calls_backend_failed: int = Field(
        0, description="Calls the backend failed: a 5xx, a timeout, unreachable, or no valid token trace."
    )
    conversations: int = Field(description="Conversations seen (lineage).")
    canonicalized_calls: int = Field(
        0,
        description="Calls forwarded with one or more re-serialised assistant turns replaced by the answer the engine "
        "sampled (producers.proxy.canonical); not one of the counts summed above.",
    )
    last_policy_version: int | None = Field(None, description="Policy version of the last recorded call, if any.")


@dataclass(frozen=True, slots=True)
class AnsweredCall:
    """A call the backend answered with a trace: what gets recorded, and when it was received (epoch ms)."""

    request: ModelRequest
    completions: list[Completion]
    latency_ms: float
    timestamp_ms: int


class EpisodeSession:
    """One open episode."""

    def __init__(
        self,
        spec: EpisodeSpec,
        settings: ProxySettings,
        writer: BusWriter,
        codec: Codec,
        images: ImageRecorder | None = None,
    ) -> None:
        """Create its recorder on the writer's producer; ``images`` keeps inline images off the bus."""
        self.spec = spec
        self.images = images
        self.token = f"orch-{secrets.token_urlsafe(32)}"
        ttl = min(spec.ttl_s, settings.max_ttl_s)
        self.deadline = time.monotonic() + ttl
        self.expires_at = int((time.time() + ttl) * 1000)
        self.recorder = EpisodeRecorder(
            writer.producer,
            run_id=settings.run_id,
            episode_id=spec.episode_id,
            task_id=spec.task_id,
            harness=spec.harness,
            model=spec.model,
            codec=codec,
            model_calls_topic=settings.model_calls_topic,
            outcomes_topic=settings.outcomes_topic,
            on_call_delivery=self._delivered,
        )
        self.lineage = ConversationTracker(settings.max_conversations)
        self.turns = SampledTurns()
        self.canonicalized_calls = 0
        self.sequencer = CallSequencer()
        self.state: EpisodeState = "active"
        self.accepting = True  # False once closing has drained: nothing more is recorded
        self.produced = self.acked = self.delivery_failed = self.publish_failed = self.dropped = 0
        self.extra_choices = 0  # answered choices beyond the first of each request (n > 1)
        self.unrecorded: dict[Unrecorded, int] = {"abandoned": 0, "refused": 0, "backend_failed": 0}
        self.last_policy_version: int | None = None
        self.closing: asyncio.Task[EpisodeSummary] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.log = log.bind(episode_id=spec.episode_id)

    def expired(self) -> bool:
        """Whether the token's lifetime has passed."""
        return time.monotonic() >= self.deadline

    def _delivered(self, delivery: Delivery) -> None:  # writer thread
        if delivery.error is None:
            self.acked += 1
        else:
            self.delivery_failed += 1
            self.log.error("model call not delivered", topic=delivery.topic, error=delivery.error)

    def take_ticket(self) -> int:
        """A ticket for a new call; ``AuthenticationError`` once the episode is closing (its token is revoked)."""
        if self.state != "active":
            raise AuthenticationError("Incorrect API key provided: the episode token was revoked")
        return self.sequencer.ticket()

    def give_up(self, ticket: int, reason: Unrecorded) -> None:
        """Release the ticket of a call that will not be recorded, counting why (once per ticket)."""
        if self.sequencer.release(ticket):
            self.unrecorded[reason] += 1
            self.log.info("model call not recorded", reason=reason)

    def canonicalize(self, request: ModelRequest) -> ModelRequest:
        """``request`` with each re-serialised assistant turn of its history replaced by the answer the engine
        sampled for it (chat form only; ``producers.proxy.canonical``)."""
        if request.recorded_flavour != "CHAT":
            return request
        messages, replaced = self.turns.canonicalize(request.messages)
        if not replaced:
            return request
        self.canonicalized_calls += 1
        self.log.info("re-serialised turns forwarded as sampled", messages=replaced)
        return with_messages(request, messages, tuple(replaced))

    def spawn_record(self, ticket: int, call: AnsweredCall) -> None:
        """Record ``call`` in the background, in its ticket's turn (takes over releasing ``ticket``); its answers are
        remembered at once, so the harness's next call can be canonicalised against them."""
        self.extra_choices += len(call.completions) - 1
        if call.request.recorded_flavour == "CHAT":
            self.turns.remember(call.completions)
        task = asyncio.create_task(self._record_in_turn(ticket, call))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record_in_turn(self, ticket: int, call: AnsweredCall) -> None:
        try:
            if self.images is not None:
                try:  # decoding, hashing and storing off the event loop, before the call is recorded
                    messages = await asyncio.to_thread(self.images.rewrite, call.request.messages)
                except Exception as exc:  # a malformed image or a store failure: the call cannot be recorded
                    self.publish_failed += len(call.completions)  # closing reports the recording incomplete
                    self.log.error("images of a model call not stored", error=str(exc))
                    return
                call = replace(call, request=replace(call.request, messages=messages))
            await self.sequencer.wait_turn(ticket)
            self.record(call)  # counts each completion: recorded (once acknowledged), failed or dropped
        except asyncio.CancelledError:  # the proxy is stopping before the call's turn came
            self.dropped += len(call.completions)
            raise
        except Exception:
            self.publish_failed += len(call.completions)
            self.log.exception("recording failed")
        finally:
            self.sequencer.release(ticket)

    def record(self, call: AnsweredCall) -> None:
        """Publish the call's completions as ModelCalls (one call of the episode at a time, in ticket order)."""
        for completion in call.completions:
            if not self.accepting:
                self.dropped += 1
                continue
            try:
                self._record_one(call, completion)
            except Exception as exc:
                self.publish_failed += 1
                self.log.error("model call not published", error=str(exc), error_type=type(exc).__name__)

    def _record_one(self, call: AnsweredCall, completion: Completion) -> None:
        request, trace = call.request, completion.trace
        prompt = np.asarray(trace.prompt_token_ids, dtype=np.int32)  # converted once, used three times
        completion_ids = np.asarray(trace.completion_token_ids, dtype=np.int32)
        conversation = self.lineage.classify(prompt)
        self.recorder.record_call(
            messages=request.messages,
            prompt_ids=prompt,
            completion_ids=completion_ids,
            logprobs=np.asarray(trace.completion_logprobs, dtype=np.float32),
            response_text=completion.text,
            policy_version=trace.policy_version,
            tool_calls=completion.tool_calls,
            tools=request.tools,
            sampling=request.sampling,
            finish_reason=completion.finish_reason,
            latency_ms=call.latency_ms,
            api_flavour=request.recorded_flavour,
            harness_api=request.flavour,
            conversation_id=conversation,
            timestamp_ms=call.timestamp_ms,
            model=request.model,
            canonicalized_messages=request.canonicalized,
        )
        self.produced += 1
        self.last_policy_version = trace.policy_version
        self.lineage.advance(conversation, prompt, completion_ids)

    def summary(self) -> EpisodeSummary:
        """The episode's state and counts now."""
        state: EpisodeState = "expired" if self.state == "active" and self.expired() else self.state
        return EpisodeSummary(
            **self.spec.model_dump(exclude={"ttl_s"}),
            state=state,
            expires_at=self.expires_at,
            calls_received=self.sequencer.ticket_count + self.extra_choices,
            calls_in_flight=self.sequencer.in_flight,
            calls_recorded=self.acked,
            calls_pending=self.produced - self.acked - self.delivery_failed,
            calls_failed=self.publish_failed + self.delivery_failed,
            calls_dropped=self.dropped,
            calls_abandoned=self.unrecorded["abandoned"],
            calls_refused=self.unrecorded["refused"],
            calls_backend_failed=self.unrecorded["backend_failed"],
            last_policy_version=self.last_policy_version,
            conversations=self.lineage.count,
            canonicalized_calls=self.canonicalized_calls,
        )


class EpisodeRegistry:
    """Open episodes by id and by token, and summaries of recently closed ones."""

    def __init__(
        self,
        settings: ProxySettings,
        writer: BusWriter,
        codec: Codec | None = None,
        images: ImageRecorder | None = None,
    ) -> None:
        """Episodes record through ``writer``; ``images`` (if any) stores inline images by digest."""
        self.settings, self.writer, self.images = settings, writer, images
        self.codec = codec or Codec.default()
        self._sessions: dict[str, EpisodeSession] = {}
        self._tokens: dict[str, EpisodeSession] = {}
        self._closed: OrderedDict[str, EpisodeSummary] = OrderedDict()

    @property
    def active(self) -> int:
        """Episodes open (not yet closed)."""
        return len(self._sessions)

    def open(self, spec: EpisodeSpec) -> EpisodeGrant:
        """Register an episode and issue its token; ``ConflictError`` if the id was used."""
        if spec.episode_id in self._sessions or spec.episode_id in self._closed:
            raise ConflictError(f"episode {spec.episode_id!r} is already registered", code="episode_exists")
        session = EpisodeSession(spec, self.settings, self.writer, self.codec, self.images)
        self._sessions[spec.episode_id] = session
        self._tokens[session.token] = session
        session.log.info("episode opened", task_id=spec.task_id, harness=spec.harness, ttl_s=spec.ttl_s)
        return EpisodeGrant(episode_id=spec.episode_id, token=session.token, expires_at=session.expires_at)

    def authenticate(self, token: str | None) -> EpisodeSession:
        """The episode of a harness's token; ``AuthenticationError`` if unknown, revoked or expired."""
        session = self._tokens.get(token) if token else None
        if session is None:
            raise AuthenticationError("Incorrect API key provided: unknown or revoked episode token")
        if session.expired():
            raise AuthenticationError("The episode token has expired", code="token_expired")
        return session

    def summary(self, episode_id: str) -> EpisodeSummary:
        """The summary of an open or recently closed episode; ``NotFoundError`` otherwise."""
        if episode_id in self._sessions:
            return self._sessions[episode_id].summary()
        if episode_id in self._closed:
            return self._closed[episode_id]
        raise NotFoundError(f"no episode {episode_id!r}")

    async def close(self, episode_id: str) -> EpisodeSummary:
        """Revoke the token and return once every recorded call is acknowledged (idempotent)."""
        if episode_id in self._closed:
            return self._closed[episode_id]
        session = self._sessions.get(episode_id)
        if session is None:
            raise NotFoundError(f"no episode {episode_id!r}")
        if session.closing is None or session.closing.done():  # a failed close may be retried
            session.closing = asyncio.create_task(self._close(session))
        return await asyncio.shield(session.closing)

    async def _close(self, session: EpisodeSession) -> EpisodeSummary:
        self._tokens.pop(session.token, None)
        session.state = "closing"
        try:
            await asyncio.wait_for(session.sequencer.drained(), self.settings.drain_timeout_s)
        except TimeoutError:
            session.log.warning("calls still in flight at close are dropped", in_flight=session.sequencer.in_flight)
        session.accepting = False
        try:
            await self.writer.flush()
        except Exception as exc:  # the delivery counts below say what was lost
            session.log.warning("flush at close failed", error=str(exc))
        summary = session.summary()
        if summary.calls_pending or summary.calls_failed:
            raise RecordingIncompleteError(
                f"episode {session.spec.episode_id!r}: {summary.calls_failed} calls failed and "
                f"{summary.calls_pending} are unacknowledged",
                summary.model_dump(),
            )
        summary = summary.model_copy(update={"state": "closed"})
        session.state = "closed"
        del self._sessions[session.spec.episode_id]
        self._remember(summary)
        session.log.info("episode closed", calls=summary.calls_recorded, conversations=summary.conversations)
        return summary

    def _remember(self, summary: EpisodeSummary) -> None:
        self._closed[summary.episode_id] = summary
        while len(self._closed) > self.settings.closed_episodes_kept:
            self._closed.popitem(last=False)

    async def reap(self) -> int:
        """Close episodes expired for longer than ``expired_grace_s`` (the Env never closed them)."""
        cutoff = time.monotonic() - self.settings.expired_grace_s
        stale = [s for s in self._sessions.values() if s.deadline <= cutoff and s.closing is None]
        for session in stale:
            session.log.warning("closing an expired episode the Env never closed")
            try:
                await self.close(session.spec.episode_id)
            except RecordingIncompleteError as exc:
                session.log.error("expired episode closed incomplete", error=exc.message)
        return len(stale)

    async def close_all(self) -> None:
        """Close every open episode (shutdown)."""
        ids = list(self._sessions)
        results = await asyncio.gather(*(self.close(episode_id) for episode_id in ids), return_exceptions=True)
        for episode_id, result in zip(ids, results, strict=True):
            if isinstance(result, BaseException):
                log.error("episode closed incomplete at shutdown", episode_id=episode_id, error=str(result))
