"""The process supervisor of ``orchard run``: start components in dependency order, keep them up, stop them cleanly.

Each component is one ``orchard ...`` subprocess in its own session (process group), so a stop or a crash takes its
whole tree with it, and a Ctrl-C in the terminal reaches only the supervisor, which then stops the components in
reverse start order: SIGTERM to the group, SIGKILL after the component's grace period. A component whose process
exits is restarted by its policy with exponential backoff, up to its limit; past it the run stops with an error.
Every change is written to ``state.json``. Resuming is starting again on the same run directory: consumers and
trainers continue from their committed offsets and checkpoints on the same bus and store, completed stages are
skipped (what they stopped stays stopped), and what had finished in the interrupted stage is not run again.

Departures from a full init system, on purpose: health is checked to decide readiness and is shown afterwards, but
only an exit triggers a restart (a hung server is the operator's call); a component restarting does not restart
its dependents (they reconnect on their own).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, Literal, Protocol

import httpx

from orchard.config import BusConfig
from orchard.logging import get_logger
from orchard.run.commands import component_command
from orchard.run.config import HttpHealth, RunConfig, StageConfig
from orchard.run.exceptions import RunError
from orchard.run.preflight import USAGE_EXIT, port_taken
from orchard.run.rundir import RunDir
from orchard.run.stages import BusProbe, StageRunner

log = get_logger("run.supervisor")

Status = Literal["pending", "starting", "healthy", "unhealthy", "backoff", "exited", "failed", "stopping", "stopped"]
TICK_S = 0.1
HEALTH_EVERY_S = 5.0  # re-probe of components already healthy, for the view only
_PR_SET_PDEATHSIG = 1


@dataclass
class ComponentState:
    """What the supervisor knows about one component."""

    name: str
    kind: str
    command: list[str]
    status: Status = "pending"
    pid: int | None = None
    restarts: int = 0
    exit_code: int | None = None
    started_at: float | None = None  # wall clock of the current process's start
    next_start: float = 0.0  # monotonic; when a component in backoff starts again
    deadline: float = 0.0  # monotonic; when a starting component counts as failed
    checked_at: float = 0.0
    failure: str | None = None  # why it failed for good, when the exit code alone does not say
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def uptime_s(self) -> float | None:
        """Seconds the current process has been running."""
        return time.time() - self.started_at if self.started_at and self.process else None

    def public(self) -> dict[str, Any]:
        """The fields written to ``state.json``."""
        return {"kind": self.kind, "command": self.command, "status": self.status, "pid": self.pid,
                "restarts": self.restarts, "exit_code": self.exit_code, "started_at": self.started_at}  # fmt: skip


class RunView(Protocol):
    """What shows the run while it goes: a terminal table, or log lines."""

    def update(self, components: list[ComponentState]) -> None:
        """Called every tick with the current component states."""


class Supervisor:
    """Starts, watches, restarts and stops the components of one run."""

    def __init__(
        self,
        config: RunConfig,
        run_dir: RunDir,
        env: Mapping[str, str],
        *,
        cwd: str | None = None,
        resumed: int = 0,
        bus: BusConfig | None = None,
        run_id: str | None = None,
    ) -> None:
        self.config, self.run_dir, self.env, self.cwd = config, run_dir, dict(env), cwd
        self.starts = resumed + 1
        self.components = {
            name: ComponentState(name, spec.kind, component_command(name, spec, config, run_dir.root))
            for name, spec in config.items()
        }
        probe = BusProbe(bus, run_id or config.run_id or run_dir.root.name) if bus is not None else None
        before = run_dir.read_state()
        previous = {s.get("name"): s for s in before.get("stages") or [] if isinstance(s, dict)}
        self.stages = StageRunner(config, probe, previous)
        self._retired: set[str] = set()  # stopped for good by a stage the run completed before a resume
        self._kept = self._settled_before(before, previous)
        self.stop_requested = False
        self.force = False
        self.outcome: Literal["running", "stopped", "completed", "failed"] = "running"
        self.reason = ""
        self._http = httpx.Client(timeout=1.0)

    # ------------------------------------------------------------------------------------------------ main loop
    def run(self, view: RunView, duration_s: float | None = None) -> str:
        """Supervise until stopped (signal, duration, ``stop_when_done``, a component past its restart limit).

        Returns the outcome: ``stopped``, ``completed`` or ``failed``; the components are all stopped on return.
        """
        (self.run_dir.root / "logs").mkdir(parents=True, exist_ok=True)
        end = time.monotonic() + duration_s if duration_s is not None else None
        self._save()
        try:
            while self.outcome == "running":
                self.step()
                view.update(list(self.components.values()))
                if self.stop_requested:
                    self._finish("stopped", "signal")
                elif end is not None and time.monotonic() >= end:
                    self._finish("stopped", "duration reached")
                time.sleep(TICK_S)
        finally:
            self.stop_all(view)
            self._http.close()
            self.stages.close()
        return self.outcome

    def failed_components(self) -> list[str]:
        """The components that failed for good, in start order."""
        return [name for name, state in self.components.items() if state.status == "failed"]

    def request_stop(self, signum: int | None = None, _frame: object = None) -> None:
        """Signal handler: the first call stops gracefully, the second skips the grace periods."""
        self.force = self.stop_requested
        self.stop_requested = True
        log.info("stop requested", signal=signal.Signals(signum).name if signum else None, force=self.force)

    def step(self) -> None:
        """One pass over the components: start what may start, notice exits and readiness, restart by policy."""
        now = time.monotonic()
        for state in self.components.values():
            if state.process is not None and state.process.poll() is not None:
                self._exited(state)
            elif state.status == "pending" and self._may_start(state.name):
                self._spawn(state)
            elif state.status == "backoff" and now >= state.next_start:
                self._spawn(state)
            elif state.status == "starting":
                self._check_starting(state, now)
            elif state.status in ("healthy", "unhealthy") and now - state.checked_at >= HEALTH_EVERY_S:
                state.checked_at = now
                self._set(state, "healthy" if self._probe(state) else "unhealthy")
        statuses = {name: state.status for name, state in self.components.items()}
        failure = self.stages.check(statuses, self._begin_stage, self._end_stage)
        if failure:
            self._finish("failed", failure)
        self._check_done()

    # ------------------------------------------------------------------------------------------------ stages
    def _settled_before(self, before: Mapping[str, Any], stages: Mapping[str, Mapping[str, Any]]) -> set[str]:
        """On a resume, what the earlier start settled stays settled; returns the components kept as exited.

        A component a completed stage stopped stays stopped (unless a stage still to run lists it), and a component
        of the interrupted stage that had already exited 0 there is not started again (a rollout would submit
        another round, a command would run twice) when that stage begins anew.
        """
        remaining = [stage.config for stage in self.stages.stages if stage.status != "completed"]
        listed_later = {name for stage in remaining for name in stage.components}
        for stage in self.stages.stages:
            if stage.status == "completed":
                for name in stage.config.stop:
                    if name not in listed_later:
                        self.components[name].status = "stopped"
                        self._retired.add(name)
        current = self.stages.current
        if current is None or (stages.get(current.config.name) or {}).get("status") not in ("running", "failed"):
            return set()  # not begun before: every component of it runs
        components = before.get("components") or {}
        kept: set[str] = set()
        for name in current.config.components:
            previous = components.get(name) or {}
            if previous.get("status") == "exited" and previous.get("exit_code") == 0:
                self.components[name].status, self.components[name].exit_code = "exited", 0
                kept.add(name)
        return kept

    def _begin_stage(self, stage: StageConfig) -> None:
        """Components of the stage that exited or were stopped start afresh; running ones stay up.

        On a resume, the components of the interrupted stage that had finished there (``_settled_before``) do not.
        """
        kept, self._kept = self._kept, set()
        for name in stage.components:
            state = self.components[name]
            if name in kept:
                log.info("component finished in this stage before the resume; not started again", component=name)
                continue
            if state.status in ("exited", "stopped"):
                state.restarts, state.exit_code = 0, None
                self._set(state, "pending")
        self._save()

    def _end_stage(self, stage: StageConfig) -> None:
        for name in stage.stop:
            state = self.components[name]
            if state.process is not None:
                self._set(state, "stopping")
                state.exit_code = self._terminate(state, self.config.components[name].stop_grace_s)
            if state.status not in ("exited", "failed"):
                self._set(state, "stopped")
        self._save()

    # ------------------------------------------------------------------------------------------------ transitions
    def _may_start(self, name: str) -> bool:
        """Its stage (if any) has begun and its dependencies are up."""
        return self.stages.may_start(name) and self._dependencies_ready(name)

    def _dependencies_ready(self, name: str) -> bool:
        ready = ("healthy", "unhealthy", "exited")
        deps = self.config.dependencies(name)
        return all(self.components[dep].status in ready or dep in self._retired for dep in deps)

    def _spawn(self, state: ComponentState) -> None:
        spec = self.config.components[state.name]
        port = spec.listen_port()
        if port is not None and port_taken(getattr(spec, "host", "127.0.0.1"), port):
            state.failure = f"port {port} is already in use by a process this run did not start"
            log.error("component not started: its port is taken", component=state.name, port=port)
            self._set(state, "failed")
            return
        logfile = self.run_dir.log(state.name).open("ab")
        header = {"event": "orchard run: starting component", "component": state.name, "command": state.command,
                  "attempt": state.restarts + 1, "run_start": self.starts, "time": time.time()}  # fmt: skip
        logfile.write((json.dumps(header) + "\n").encode())
        logfile.flush()
        env = {**self.env, **spec.env, **self.stages.stage_env(state.name)}  # the stage's start, for --start stage
        state.process = self._popen(state.command, env, logfile)
        logfile.close()  # the child holds its own descriptor
        state.pid, state.exit_code, state.started_at = state.process.pid, None, time.time()
        state.deadline = time.monotonic() + spec.start_timeout_s
        log.info("component started", component=state.name, pid=state.pid, attempt=state.restarts + 1)
        self._set(state, "starting")

    def _popen(self, command: list[str], env: dict[str, str], logfile: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(  # noqa: S603 - the command is built from a validated recipe, no shell
            command, env=env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=logfile, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent,
        )  # fmt: skip

    def _check_starting(self, state: ComponentState, now: float) -> None:
        health = self.config.health_check(state.name)
        if isinstance(health, HttpHealth):
            ready = self._probe(state)
        else:
            ready = state.started_at is not None and time.time() - state.started_at >= health.alive_s
        if ready:
            state.checked_at = now
            log.info("component healthy", component=state.name, pid=state.pid)
            self._set(state, "healthy")
        elif now >= state.deadline:
            log.warning("component not healthy in time", component=state.name, pid=state.pid)
            self._terminate(state, grace_s=self.config.components[state.name].stop_grace_s)
            state.exit_code = None
            self._after_exit(state, failed=True)

    def _probe(self, state: ComponentState) -> bool:
        health = self.config.health_check(state.name)
        if not isinstance(health, HttpHealth):
            return True
        spec = self.config.components[state.name]
        host = getattr(spec, "host", "127.0.0.1")
        host = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # noqa: S104 - probe a wildcard bind on loopback
        try:
            return self._http.get(f"http://{host}:{spec.listen_port()}{health.path}").status_code == 200
        except httpx.HTTPError:
            return False

    def _exited(self, state: ComponentState) -> None:
        process, state.process = state.process, None
        code = process.returncode if process is not None else None
        if process is not None:
            _kill_group(process.pid, signal.SIGKILL)  # whatever it left behind in its group goes with it
        state.exit_code = code
        log.warning("component exited", component=state.name, pid=state.pid, exit_code=code)
        if code == USAGE_EXIT:  # a bad option or argument: the same command would fail the same way again
            state.failure = f"usage error (exit code {USAGE_EXIT}), not restarted"
            self._set(state, "failed")
            return
        self._after_exit(state, failed=code != 0)

    def _after_exit(self, state: ComponentState, *, failed: bool) -> None:
        policy = self.config.restart_policy(state.name)
        restart = policy.policy == "always" or (policy.policy == "on-failure" and failed)
        if not restart:
            self._set(state, "failed" if failed else "exited")
        elif state.restarts >= policy.max_restarts:
            log.error("component past its restart limit", component=state.name, restarts=state.restarts)
            self._set(state, "failed")
        else:
            delay = policy.delay(state.restarts)
            state.restarts += 1
            state.next_start = time.monotonic() + delay
            log.info("component restarting", component=state.name, in_s=delay, restart=state.restarts)
            self._set(state, "backoff")

    def _check_done(self) -> None:
        failed = [f"{s.name} ({s.failure})" if s.failure else s.name
                  for s in self.components.values() if s.status == "failed"]  # fmt: skip
        if failed:
            self._finish("failed", f"component(s) failed: {', '.join(failed)}")
            return
        if self.config.stages:
            if self.stages.finished:
                self._finish("completed", f"all {len(self.config.stages)} stages completed")
            return
        done = self.config.stop_when_done
        if done and all(self.components[name].status == "exited" for name in done):
            self._finish("completed", f"{', '.join(done)} finished")
        elif all(s.status == "exited" for s in self.components.values()):
            self._finish("completed", "every component finished")

    def _finish(self, outcome: Literal["stopped", "completed", "failed"], reason: str) -> None:
        if self.outcome == "running":
            self.outcome, self.reason = outcome, reason
            log.info("run ending", outcome=outcome, reason=reason)

    # ------------------------------------------------------------------------------------------------ stopping
    def stop_all(self, view: RunView | None = None) -> None:
        """Stop every running component, in reverse start order, and record the final state."""
        if self.outcome == "running":
            self._finish("stopped", "stop_all")
        for state in reversed(list(self.components.values())):
            if state.process is None:
                if state.status in ("pending", "backoff", "starting"):
                    self._set(state, "stopped")
                continue
            self._set(state, "stopping")
            if view is not None:
                view.update(list(self.components.values()))
            grace = 0.0 if self.force else self.config.components[state.name].stop_grace_s
            state.exit_code = self._terminate(state, grace)
            self._set(state, "stopped")
        self._save()

    def _terminate(self, state: ComponentState, grace_s: float) -> int | None:
        """SIGTERM the component's group, SIGKILL it after ``grace_s``; returns the exit code."""
        process = state.process
        if process is None:
            return state.exit_code
        _kill_group(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while process.poll() is None and time.monotonic() < deadline and not self.force:
            time.sleep(0.05)
        if process.poll() is None:
            log.warning("component ignored SIGTERM; killing it", component=state.name, pid=process.pid)
        _kill_group(process.pid, signal.SIGKILL)
        code = process.wait()
        state.process = None
        log.info("component stopped", component=state.name, pid=process.pid, exit_code=code)
        return code

    # ------------------------------------------------------------------------------------------------ state.json
    def _set(self, state: ComponentState, status: Status) -> None:
        if state.status != status:
            state.status = status
            self._save()

    def _save(self) -> None:
        previous = self.run_dir.read_state()
        self.run_dir.write_state({
            "run_dir": str(self.run_dir.root.resolve()),
            "status": self.outcome,
            "reason": self.reason,
            "supervisor_pid": os.getpid() if self.outcome == "running" else None,
            "starts": self.starts,
            "first_started_at": previous.get("first_started_at", time.time()),
            "updated_at": time.time(),
            "components": {name: state.public() for name, state in self.components.items()},
            "stages": self.stages.public(),
        })  # fmt: skip


def _kill_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _die_with_parent() -> None:
    """In the child, before exec: die when the supervisor dies, even by SIGKILL (Linux only; a no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def install_signal_handlers(handler: Callable[[int, Any], None]) -> None:
    """Route SIGINT and SIGTERM to ``handler`` (the supervisor's ``request_stop``)."""
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def ensure_not_running(run_dir: RunDir) -> int:
    """Refuse a run directory another live supervisor owns; return how many times the run was started."""
    state = run_dir.read_state()
    pid = state.get("supervisor_pid")
    if isinstance(pid, int) and pid != os.getpid() and _alive(pid):
        raise RunError(f"run directory {run_dir.root} is in use by a running supervisor (pid {pid})")
    for name, component in (state.get("components") or {}).items():
        other = component.get("pid")
        if component.get("status") not in ("stopped", "exited", "failed") and isinstance(other, int) and _alive(other):
            raise RunError(f"component {name} of {run_dir.root} still runs as pid {other}; stop it first")
    return int(state.get("starts", 0))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
