"""Runs one episode end to end: sandbox, proxy token, harness, grader, outcome — the Env's ``EpisodeRunner``.

Order matters for what the trainers may trust:

1. the sandbox is created from the task's workspace (no history, no hidden files);
2. the proxy issues a per-episode token; the harness runs inside the sandbox and reaches only the proxy;
3. when the harness exits, the proxy episode is closed, which returns only once every model call is acknowledged
   by the bus — so the outcome, published last, never refers to calls that could still be lost;
4. only then are the hidden files copied in and the grader run;
5. the outcome is published (and acknowledged), and the sandbox deleted.

The outcome's ``model_call_counts`` are the proxy's counts at close (``CALL_COUNTS``): every call it received, and
what became of each (recorded, abandoned by the harness, refused or failed by the backend, ...); they add up to
``received``. An episode stopped before it finished (``report``) gets them too, when its proxy episode closes.

A request naming an unknown task or harness, or harness options its adapter refuses, is refused by ``check`` at
submission. Failures of the platform (no sandbox, no proxy) raise ``InfrastructureError`` and the scheduler retries;
a harness that crashes (killed by a signal: exit status 128 + N) or cannot start yields a ``CRASHED`` outcome without
grading, its error naming what happened with the last lines of the harness's stderr. "Cannot start" is exit status
126 or 127 (not executable, not found), or any other non-zero exit before the harness's first model call reached the
proxy (the proxy's ``calls_received``): an interpreter that cannot import its agent, a missing dependency, a bad
flag. A harness that made a model call and then exits non-zero is graded like any other. Every path ends with
exactly one outcome.

Each step is an event of the episode (``GET /episodes/{id}/events``), in this order: ``sandbox-created``,
``sandbox-ready`` (the proxy token issued), ``harness-prepared`` and ``harness-ran`` (the harness's command started
and exited; their ``at`` is when, the event's ``time`` when the Env noted it), ``harness-exited`` (its artifacts
collected), ``proxy-closed``, ``graded`` and ``published``; ``benchmarks/episodes.py`` times the phases between them.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import httpx

from orchard.bus import Producer
from orchard.clock import now_ms
from orchard.codec import Codec
from orchard.env.exceptions import InvalidEpisodeError
from orchard.env.scheduler import Episode, EpisodeState, EventSink, InfrastructureError
from orchard.env.tasks import Grade, TaskCatalog, TaskSpec, grade
from orchard.exceptions import OrchardError
from orchard.harnesses.base import (
    HarnessAdapter,
    HarnessRun,
    HarnessTask,
    ModelEndpoint,
    PhaseHook,
    run_harness,
)
from orchard.harnesses.factory import HarnessConfig, open_harness
from orchard.logging import get_logger
from orchard.sandbox import Runtime, Sandbox, SandboxSpec
from orchard.topics import OUTCOMES

log = get_logger("env.episode")
NOT_STARTED_EXIT_CODES = frozenset({126, 127})
"""The shell's "found but not executable" and "not found": the harness never ran."""
CRASH_EXIT_CODES = NOT_STARTED_EXIT_CODES | frozenset(range(128, 256))
"""Harness exit statuses that mean ``CRASHED``: it could not start, or a signal killed it (``128 + N``)."""
CALL_COUNTS = ("recorded", "pending", "failed", "dropped", "abandoned", "refused", "backend_failed", "in_flight")
"""The proxy's counts (``calls_<name>`` in its episode summary) that add up to its ``calls_received``."""
STDERR_LINES = 12
STDERR_IN_ERROR = 2000
"""How much of the end of a crashed harness's stderr the outcome's ``error`` keeps: its last lines, at most this many
characters."""


class ProxyAdmin:
    """The recording proxy's admin routes: open an episode (a token), close it (all calls acknowledged)."""

    def __init__(self, base_url: str, admin_token: str, timeout_s: float = 60.0) -> None:
        self._client = httpx.AsyncClient(
            base_url=base_url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=timeout_s
        )

    async def open_episode(self, episode_id: str, task_id: str, harness: str, model: str, ttl_s: float) -> str:
        """A fresh token for the episode's harness."""
        body = {"episode_id": episode_id, "task_id": task_id, "harness": harness, "model": model, "ttl_s": ttl_s}
        response = await self._request("POST", "/admin/episodes", json=body)
        return str(response.json()["token"])

    async def close_episode(self, episode_id: str) -> dict[str, Any]:
        """Revoke the token; returns once every recorded call is acknowledged by the bus."""
        response = await self._request("DELETE", f"/admin/episodes/{episode_id}")
        return dict(response.json())

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise InfrastructureError(f"recording proxy unreachable: {exc}") from exc
        if response.status_code >= 300:
            raise InfrastructureError(f"recording proxy answered {response.status_code}: {response.text[:300]}")
        return response

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()


class LocalEpisodeRunner:
    """Drives episodes on a ``Runtime`` through a recording proxy; publishes each outcome."""

    def __init__(
        self,
        *,
        runtime: Runtime,
        tasks: TaskCatalog,
        proxy: ProxyAdmin,
        proxy_url: str,
        producer: Producer,
        run_id: str,
        outcomes_topic: str = OUTCOMES,
    ) -> None:
        self.runtime, self.tasks, self.proxy, self.proxy_url = runtime, tasks, proxy, proxy_url
        self.producer, self.run_id, self.outcomes_topic = producer, run_id, outcomes_topic
        self.codec = Codec.default()
        self._started: dict[str, int] = {}
        self._calls: dict[str, int] = {}
        self._counts: dict[str, dict[str, int]] = {}
        self._versions: dict[str, int | None] = {}
        self._published: set[str] = set()  # episodes whose outcome is sent (or being sent): never a second one

    def check(self, request: dict[str, Any]) -> None:
        """Refuse a request that could never run: an unknown task or harness, harness options the adapter refuses."""
        try:
            self.tasks.get(request["task_id"])
        except OrchardError as exc:
            raise InvalidEpisodeError(str(exc)) from None
        options = request.get("options", {}).get("harness", {})
        if not isinstance(options, dict):
            raise InvalidEpisodeError(f"options.harness must be an object of adapter settings, not {options!r}")
        try:
            _adapter(request)
        except (OrchardError, TypeError, ValueError) as exc:
            raise InvalidEpisodeError(f"harness {request['harness']!r}: {exc}") from None

    async def run(self, episode: Episode, emit: EventSink) -> EpisodeState:
        """Run the episode and publish its outcome."""
        request = episode.request
        task = self.tasks.get(request["task_id"])
        self._started[episode.episode_id] = now_ms()
        sandbox = await self._sandbox(episode, task)
        try:
            emit("sandbox-created", sandbox_id=sandbox.spec.sandbox_id)
            token = await self.proxy.open_episode(
                episode.episode_id, task.task_id, request["harness"], request["model"], task.harness_timeout_s * 2
            )
            emit("sandbox-ready", sandbox_id=sandbox.spec.sandbox_id)
            run = await self._harness(sandbox, task, request, token, emit)
            emit("harness-exited", exit_code=run.exit_code, timed_out=run.timed_out)
            received = self._note_calls(episode, await self.proxy.close_episode(episode.episode_id))
            emit("proxy-closed", calls_received=received)
            ended = harness_end(run, received)
            if ended is not None:
                return await self._ungraded(episode, ended, run, received, emit)
            return await self._graded(episode, sandbox, task, run, emit)
        finally:
            await asyncio.to_thread(self.runtime.delete, sandbox.spec.sandbox_id)

    def _note_calls(self, episode: Episode, summary: dict[str, Any]) -> int:
        """Keep the proxy's call counts and last policy version for the outcome; return the calls it received."""
        counts = model_call_counts(summary)
        self._calls[episode.episode_id] = counts["recorded"]
        self._counts[episode.episode_id] = counts
        self._versions[episode.episode_id] = summary.get("last_policy_version")
        return counts["received"]

    async def _ungraded(
        self, episode: Episode, state: EpisodeState, run: HarnessRun, received: int, emit: EventSink
    ) -> EpisodeState:
        """Publish the outcome of a harness that timed out, crashed or could not start (never graded)."""
        error = harness_failure(run, received)
        log.warning("harness_failed", episode=episode.episode_id, state=state.value, error=error)
        await self._publish(episode, state, None, error, run)
        emit("published", status=state.value)
        episode.result = {"harness_exit_code": run.exit_code}
        return state

    async def _graded(
        self, episode: Episode, sandbox: Sandbox, task: TaskSpec, run: HarnessRun, emit: EventSink
    ) -> EpisodeState:
        """Grade the working copy and publish the outcome."""
        if run.exit_code != 0:
            stderr = _stderr_tail(run)
            log.info("harness_exited_non_zero", episode=episode.episode_id, exit_code=run.exit_code, stderr=stderr)
        verdict = await asyncio.to_thread(grade, sandbox, task)
        emit("graded", reward=verdict.reward, success=verdict.success)
        state = EpisodeState.SUCCEEDED if verdict.success else EpisodeState.FAILED
        await self._publish(episode, state, verdict, None, run)
        emit("published", status=state.value)
        episode.result = {"reward": verdict.reward, "signals": verdict.signals, "harness_exit_code": run.exit_code}
        return state

    async def report(self, episode: Episode, state: EpisodeState, error: str | None) -> None:
        """Close what is open and publish the outcome of an episode that did not finish (none when its outcome was
        already sent: a cancellation that lands after ``run`` published must not add a second one)."""
        try:
            self._note_calls(episode, await self.proxy.close_episode(episode.episode_id))
        except InfrastructureError as exc:
            log.warning("closing the proxy episode failed", episode=episode.episode_id, error=str(exc))
        await asyncio.to_thread(self.runtime.delete, _sandbox_id(episode))
        await self._publish(episode, state, None, error, None)

    async def _sandbox(self, episode: Episode, task: TaskSpec) -> Sandbox:
        spec = SandboxSpec(
            sandbox_id=_sandbox_id(episode),
            run_id=self.run_id,
            episode_id=episode.episode_id,
            task_id=task.task_id,
            source_dir=task.workspace,
            image=task.image,
            git_snapshot=task.git_snapshot or None,  # False: whatever the runtime does by default
            limits=task.limits,
            ttl_s=task.harness_timeout_s * 2,
            proxy_url=self.proxy_url,
        )
        creation = asyncio.ensure_future(asyncio.to_thread(self.runtime.create, spec))
        try:
            return await asyncio.shield(creation)
        except asyncio.CancelledError:
            # The creating thread cannot be stopped: let it finish, then remove what it made, so a cancelled or
            # timed-out episode leaves no sandbox behind.
            await asyncio.gather(creation, return_exceptions=True)
            await asyncio.to_thread(self.runtime.delete, spec.sandbox_id)
            raise
        except Exception as exc:  # noqa: BLE001 - any failure to build the sandbox is the platform's
            raise InfrastructureError(f"sandbox for {episode.episode_id} could not be created: {exc}") from exc

    async def _harness(
        self, sandbox: Sandbox, task: TaskSpec, request: dict[str, Any], token: str, emit: EventSink
    ) -> HarnessRun:
        adapter = _adapter(request)
        endpoint = ModelEndpoint.inside(sandbox, token, request["model"])
        harness_task = HarnessTask(
            instruction=task.instruction, max_steps=task.max_steps, timeout_s=task.harness_timeout_s
        )
        on_phase = _threadsafe_phases(emit)
        return await asyncio.to_thread(run_harness, adapter, sandbox, endpoint, harness_task, on_phase)

    async def _publish(
        self, episode: Episode, state: EpisodeState, verdict: Grade | None, error: str | None, run: HarnessRun | None
    ) -> None:
        if episode.episode_id in self._published:
            log.info("outcome already published", episode=episode.episode_id, status_not_sent=state.value)
            return
        request = episode.request
        record = {
            "run_id": self.run_id,
            "episode_id": episode.episode_id,
            "task_id": request["task_id"],
            "group_id": request.get("group_id") or request["task_id"],
            "status": state.value,
            "reward": verdict.reward if verdict else 0.0,
            "success": bool(verdict and verdict.success),
            "signals": verdict.signals if verdict else {},
            "num_model_calls": self._calls.pop(episode.episode_id, 0),
            "model_call_counts": self._counts.pop(episode.episode_id, None),
            "artifact_uris": [],
            "policy_version": self._versions.pop(episode.episode_id, None),
            "started_at": self._started.pop(episode.episode_id, now_ms()),
            "ended_at": now_ms(),
            "error": error,
        }
        value = self.codec.encode("EpisodeOutcome", record)
        self._published.add(episode.episode_id)
        sending = asyncio.ensure_future(
            asyncio.to_thread(self.producer.send, self.outcomes_topic, value, episode.episode_id.encode())
        )
        try:
            # shielded: a cancellation now must neither stop the send (its thread runs on anyway) nor let report()
            # publish a CANCELLED outcome beside it
            await asyncio.shield(sending)
        except asyncio.CancelledError:
            raise
        except BaseException:
            self._published.discard(episode.episode_id)  # it did not go out: a report may still say what happened
            raise


def model_call_counts(summary: dict[str, Any]) -> dict[str, int]:
    """The outcome's ``model_call_counts`` from the proxy's episode summary (a count it does not report is 0).

    >>> counts = model_call_counts({"calls_received": 3, "calls_recorded": 1, "calls_abandoned": 1, "calls_refused": 1})
    >>> counts["received"] == sum(counts[name] for name in CALL_COUNTS), counts["abandoned"], counts["failed"]
    (True, 1, 0)
    """
    counts = {name: int(summary.get(f"calls_{name}", 0)) for name in CALL_COUNTS}
    return {"received": int(summary.get("calls_received", sum(counts.values())))} | counts


def _threadsafe_phases(emit: EventSink) -> PhaseHook:
    """A ``run_harness`` phase hook for a worker thread: each phase becomes an event (``at``: when it happened)."""
    loop = asyncio.get_running_loop()

    def on_phase(kind: str) -> None:
        at = time.time()
        loop.call_soon_threadsafe(lambda: emit(kind, at=at))

    return on_phase


def _adapter(request: dict[str, Any]) -> HarnessAdapter:
    return open_harness(HarnessConfig(type=request["harness"], options=request.get("options", {}).get("harness", {})))


def harness_end(run: HarnessRun, calls_received: int) -> EpisodeState | None:
    """``TIMED_OUT`` or ``CRASHED`` for a harness whose work is not graded; ``None`` when it is.

    >>> from orchard.harnesses.base import HarnessArtifacts
    >>> def ended(code): return HarnessRun(harness="h", exit_code=code, timed_out=False, duration_ms=1.0,
    ...                                    artifacts=HarnessArtifacts(harness="h"))
    >>> harness_end(ended(1), calls_received=0), harness_end(ended(1), calls_received=3), harness_end(ended(0), 0)
    (<EpisodeState.CRASHED: 'CRASHED'>, None, None)
    """
    if run.timed_out or run.exit_code is None:
        return EpisodeState.TIMED_OUT
    if run.exit_code in CRASH_EXIT_CODES or _exited_before_first_call(run, calls_received):
        return EpisodeState.CRASHED
    return None


def _exited_before_first_call(run: HarnessRun, calls_received: int) -> bool:
    return run.exit_code is not None and run.exit_code != 0 and calls_received == 0


def harness_failure(run: HarnessRun, calls_received: int | None = None) -> str:
    """The outcome's ``error`` for a harness that timed out, could not start or was killed: what happened, and the
    last lines of its stderr (where the reason usually is). ``calls_received``: model calls that reached the proxy.

    >>> from orchard.harnesses.base import HarnessArtifacts
    >>> killed = HarnessRun(harness="h", exit_code=137, timed_out=False, duration_ms=1.0,
    ...                     artifacts=HarnessArtifacts(harness="h", logs={"stderr": "boom"}))
    >>> harness_failure(killed)
    'harness h was killed by signal 9 (SIGKILL), exit status 137; stderr: boom'
    """
    stderr = _stderr_tail(run)
    what = _what_happened(run, calls_received)
    return f"{what}; stderr: {stderr}" if stderr else what


def _what_happened(run: HarnessRun, calls_received: int | None) -> str:
    code, name = run.exit_code, run.harness
    if run.timed_out or code is None:
        return f"harness {name} timed out"
    if code in NOT_STARTED_EXIT_CODES:
        return (
            f"harness {name} could not start ({'not found' if code == 127 else 'not executable'}), exit status {code}"
        )
    if code >= 128:
        return f"harness {name} was killed by signal {code - 128} ({_signal_name(code - 128)}), exit status {code}"
    if calls_received is not None and _exited_before_first_call(run, calls_received):
        return f"harness {name} could not start: it exited with status {code} before its first model call"
    return f"harness {name} exited with status {code}"


def _stderr_tail(run: HarnessRun) -> str:
    """The last ``STDERR_LINES`` lines of the harness's stderr, at most ``STDERR_IN_ERROR`` characters."""
    lines = run.artifacts.logs.get("stderr", "").strip().splitlines()
    return "\n".join(lines[-STDERR_LINES:])[-STDERR_IN_ERROR:]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


def _sandbox_id(episode: Episode) -> str:
    return episode.episode_id.lower().replace("_", "-")[:63]
