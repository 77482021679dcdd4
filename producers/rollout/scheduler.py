"""The rollout scheduler: reads ``outcomes``, sizes each task's next group with Balanced Adaptive Rollout, submits.

It works in rounds. A round asks ``BalancedRollout.allocate`` how many rollouts each task gets, and submits that
many episodes per task to Orchard Env under one ``group_id`` per task and round (``r<round, 6 digits>-<task>``), so
the consumers compare exactly the episodes that were started together. It then reads outcomes until every episode
of the round has one (or ``round_timeout_s`` passes; a late outcome still updates the estimates), and plans the
next round from the updated estimates.

The bus is the source of truth: at start the scheduler replays the whole ``outcomes`` topic (a group-less
consumer), so its estimates and its round counter are rebuilt from the run's past outcomes after a restart, and it
keeps no state of its own. Episode ids are derived from run, group and index, so if a round is submitted again
after a crash, Env answers 409 for the episodes it already has and nothing runs twice (``EnvSubmitter`` treats that
as done). The submit function is injectable: tests pass a list's ``append``.

Rollouts can run ahead of the trainer: on 2 cores the file-lookup recipe's episodes came 2.9 policy versions ahead
of the trainer that learned from them, and the trainer dropped the samples that were more than 4 behind. With
``new_policy_wait_s`` each round after the first waits (at most that long) until the run has published a policy
version newer than the one the previous round started with, so the rollouts stay within about a round of the
trainer. The wait is bounded because a round can give the trainer nothing to learn from (every group uniform), and
then no new version comes; such a round goes ahead after the wait and is counted.

**Lockstep** (``lockstep``) takes the clock out of RL: each round is trained, whole, before the next one starts.
Before it submits round *r* the scheduler records its plan (a ``RolloutRound`` with ``complete: false`` on
``rollout-rounds``). Once every episode has an outcome, it waits until the pipeline has made all of the round's
samples (``LockstepHooks.pipeline_caught_up``: the assembler, scorer and sample-builder groups are done with every
record of their topics; the sample builder closes a group once every episode of it has arrived), then announces the
round (``complete: true``) with the samples topic's end offsets at that moment. A trainer with ``input: rounds``
trains exactly the samples before those offsets, in key order, and publishes a version whose
``metrics["rollout_round"]`` is *r*, even when the round taught nothing; the scheduler waits for that version, and
for the engine to serve it (``LockstepHooks.engine_serves``), before round *r+1*. After the last round it waits for
its version too, so the stage ends with every round trained. No wait lets a round go ahead early: each gives up, and
the scheduler raises ``LockstepTimeout``, only after ``round_timeout_s`` (a round whose outcomes did not all come in
that time is announced with what came, and counted as timed out). A restarted scheduler finishes a round it had
planned but not announced: it waits for the outcomes of every episode of the plan, then announces it.

**Seeds.** With ``seed`` each episode's harness gets its own sampling seed
(``orchard.episode_requests.episode_seed``, from the seed and the episode id, which is derived from run, round and
task), so a rerun of the same rounds with the same weights samples the same tokens.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from orchard.bus import Bus, Consumer, Producer, Record, TopicPartition, read_until_quiet
from orchard.clock import now_ms
from orchard.codec import Codec
from orchard.episode_requests import EpisodeRequest, SubmitFn, seeded_options
from orchard.logging import get_logger
from orchard.serialization_errors import SerializationError
from orchard.topics import OUTCOMES, POLICY_VERSIONS, ROLLOUT_ROUNDS, SAMPLES
from producers.rollout.balanced import BalancedRollout, BalancedRolloutConfig
from producers.rollout.exceptions import SubmissionError

log = get_logger("producers.rollout")

_ROUND = re.compile(r"^r(\d{6,})-")


class RolloutSchedulerConfig(BaseModel):
    """What to roll out (run, tasks, harness, model) and how (Balanced Adaptive Rollout settings, rounds)."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(..., min_length=1, description="Run whose outcomes are read and whose episodes are started.")
    tasks: list[str] = Field(..., min_length=1, description="Task ids to roll out.")
    harness: str = Field(..., min_length=1, description="Harness of every episode.")
    model: str = Field(..., min_length=1, description="Model name the harness asks the proxy for.")
    rollout: BalancedRolloutConfig = Field(default_factory=BalancedRolloutConfig)
    rounds: int | None = Field(None, ge=1, description="Rounds to run (None: until stopped).")
    max_episodes: int | None = Field(
        None, ge=1, description="Episodes to submit in all (None: no cap); a round is cut short at the cap."
    )
    round_timeout_s: float = Field(3600.0, gt=0, description="Longest wait for a round's outcomes.")
    episode_timeout_s: float | None = Field(None, gt=0, description="Override of Env's episode timeout.")
    options: dict[str, Any] = Field(default_factory=dict, description="Harness- or task-specific settings.")
    topic: str = Field(OUTCOMES, min_length=1, description="Topic of EpisodeOutcome records.")
    new_policy_wait_s: float | None = Field(
        None,
        gt=0,
        description="Before each round after the first, wait up to this long for a policy version of the run newer "
        "than the one the previous round started with (None: never wait).",
    )
    versions_topic: str = Field(POLICY_VERSIONS, min_length=1, description="Topic of PolicyVersion records.")
    lockstep: bool = Field(
        False,
        description="Train each round, whole, before the next: announce it once its samples are made, wait for the "
        "version trained on it (module docstring). Needs a trainer with input: rounds.",
    )
    rounds_topic: str = Field(ROLLOUT_ROUNDS, min_length=1, description="Topic of RolloutRound records (lockstep).")
    samples_topic: str = Field(
        SAMPLES, min_length=1, description="Lockstep: the topic the round's samples end on (named in its announcement)."
    )
    seed: int | None = Field(
        None, ge=0, description="Give each episode's harness a sampling seed derived from this and its episode id."
    )


def group_id_for(round_index: int, task_id: str) -> str:
    """The group id of ``task_id``'s episodes in round ``round_index``."""
    return f"r{round_index:06d}-{task_id}"


@dataclass
class LockstepHooks:
    """What a lockstep scheduler asks of the world beyond the bus (``orchard rollout run`` builds them)."""

    pipeline_caught_up: Callable[[], bool]
    """Whether every consumer between the outcomes and the samples topic is done with what is on its topics."""
    engine_serves: Callable[[int], bool] | None = None
    """Whether the policy engine serves version ``v`` (or newer); None: no engine to wait for."""


def episode_id_for(run_id: str, group_id: str, index: int) -> str:
    """A deterministic episode id (Env's pattern: lower-case letters, digits and '-', at most 63 characters)."""
    digest = hashlib.blake2b(f"{run_id}\0{group_id}".encode(), digest_size=10).hexdigest()
    return f"e{digest}-{index}"


class RolloutScheduler:
    """Rounds of submissions sized by Balanced Adaptive Rollout; ``observe`` feeds it outcomes. No I/O of its own."""

    def __init__(self, config: RolloutSchedulerConfig, submit: SubmitFn, policy: BalancedRollout | None = None) -> None:
        self.config = config
        self.submit = submit
        self.policy = policy or BalancedRollout(config.rollout)
        self.round = 0  # the next round to submit
        self.rounds_submitted = 0
        self.outstanding: set[str] = set()
        self.observed = 0
        self.submitted = 0
        self.timed_out_rounds = 0
        self.out_of_tasks = False  # a round found no task under max_task_outcomes
        self.policy_version: int | None = None  # the newest published version of the run seen so far
        self.round_policy_version: int | None = None  # the newest version when the last round was submitted
        self.rounds_without_new_policy = 0  # rounds that went ahead after new_policy_wait_s with no newer version
        self.trained_round: int | None = None  # lockstep: the newest round a published version was trained on
        self.trained_round_version: int | None = None  # ... and that version
        self.announced: set[int] = set()  # lockstep: rounds announced on rollout-rounds
        self.last_outcome_round: int | None = None  # the newest round an outcome of this run names
        self.round_groups: list[str] = []  # the group ids of the last round submitted
        self.round_requests: list[EpisodeRequest] = []  # and its episodes
        self.outcome_groups: dict[int, set[str]] = {}  # round -> the group ids its outcomes name
        self.outcome_episodes: dict[int, set[str]] = {}  # round -> the episodes with an outcome
        self.planned: dict[int, tuple[int, list[str]]] = {}  # lockstep: round -> (episodes, group ids) planned

    @property
    def exhausted(self) -> bool:
        """Whether the ``max_episodes`` cap is reached (nothing more will be submitted)."""
        cap = self.config.max_episodes
        return cap is not None and self.submitted >= cap

    def observe(self, outcome: Mapping[str, Any]) -> bool:
        """Fold in one decoded ``EpisodeOutcome``; False for another run's (ignored)."""
        if outcome["run_id"] != self.config.run_id:
            return False
        self.policy.observe_outcome(outcome)
        self.outstanding.discard(str(outcome["episode_id"]))
        self.observed += 1
        match = _ROUND.match(str(outcome["group_id"]))
        if match is not None:  # after a restart, continue numbering after the newest round seen
            self.round = max(self.round, int(match.group(1)) + 1)
            self.last_outcome_round = max(int(match.group(1)), -1 if self.last_outcome_round is None else
                                          self.last_outcome_round)  # fmt: skip
            self.outcome_groups.setdefault(int(match.group(1)), set()).add(str(outcome["group_id"]))
            self.outcome_episodes.setdefault(int(match.group(1)), set()).add(str(outcome["episode_id"]))
        return True

    def observe_policy_version(self, version: Mapping[str, Any]) -> bool:
        """Fold in one decoded ``PolicyVersion``; False for another run's (ignored)."""
        if version["run_id"] != self.config.run_id:
            return False
        self.policy_version = max(int(version["version"]), -1 if self.policy_version is None else self.policy_version)
        trained = (version.get("metrics") or {}).get("rollout_round")
        if trained is not None and (self.trained_round is None or int(trained) >= self.trained_round):
            self.trained_round, self.trained_round_version = int(trained), int(version["version"])
        return True

    def observe_round(self, announced: Mapping[str, Any]) -> bool:
        """Fold in one decoded ``RolloutRound`` (planned or complete); False for another run's (ignored)."""
        if announced["run_id"] != self.config.run_id:
            return False
        if announced.get("complete", True):
            self.announced.add(int(announced["round"]))
        else:
            self.planned[int(announced["round"])] = (int(announced["episodes"]), list(announced["group_ids"]))
        return True

    def trained(self, round_index: int) -> bool:
        """Whether a published version says it was trained on round ``round_index`` (or a later one)."""
        return self.trained_round is not None and self.trained_round >= round_index

    @property
    def awaits_new_policy(self) -> bool:
        """Whether the next round should wait for a newer policy version (``new_policy_wait_s``) and none came yet."""
        if self.config.new_policy_wait_s is None or self.rounds_submitted == 0:
            return False
        newest = -1 if self.policy_version is None else self.policy_version
        started = -1 if self.round_policy_version is None else self.round_policy_version
        return newest <= started

    def plan_round(self) -> list[EpisodeRequest]:
        """The episodes of the next round (not yet submitted)."""
        allocation = self.policy.allocate(self.config.tasks)
        requests = []
        for task_id in sorted(allocation):
            group_id = group_id_for(self.round, task_id)
            for index in range(allocation[task_id]):
                episode_id = episode_id_for(self.config.run_id, group_id, index)
                requests.append(
                    EpisodeRequest(
                        task_id=task_id,
                        group_id=group_id,
                        episode_id=episode_id,
                        harness=self.config.harness,
                        model=self.config.model,
                        timeout_s=self.config.episode_timeout_s,
                        options=seeded_options(self.config.options, self.config.seed, episode_id),
                    )
                )
        return requests

    def submit_round(self, planned: Callable[[list[EpisodeRequest]], None] | None = None) -> list[EpisodeRequest]:
        """Plan the next round, submit every episode of it, and wait for their outcomes from now on; ``planned`` is
        called with the round's episodes before any is submitted (a lockstep scheduler records the plan)."""
        requests = self.plan_round()
        if self.config.max_episodes is not None:
            requests = requests[: max(0, self.config.max_episodes - self.submitted)]
        if not requests:
            return requests
        if planned is not None:
            planned(requests)
        for request in requests:
            self.submit(request)
        self.outstanding = {request.episode_id for request in requests}
        sizes = {request.group_id: 0 for request in requests}
        for request in requests:
            sizes[request.group_id] += 1
        log.info("rollout round submitted", run_id=self.config.run_id, round=self.round, groups=sizes,
                 policy_version=self.policy_version)  # fmt: skip
        self.round_policy_version = self.policy_version
        self.round_groups, self.round_requests = sorted(sizes), requests
        self.round += 1
        self.rounds_submitted += 1
        self.submitted += len(requests)
        return requests

    @property
    def round_done(self) -> bool:
        """Whether every episode of the last submitted round has an outcome."""
        return not self.outstanding


class EnvSubmitter:
    """Submits episodes to an Orchard Env service (``POST /episodes``); an episode Env already has counts as done."""

    def __init__(
        self, base_url: str, token: str, timeout_s: float = 30.0, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        self._client = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s, transport=transport
        )

    def __call__(self, request: EpisodeRequest) -> None:
        """Submit one episode; ``SubmissionError`` if Env is unreachable or refuses it."""
        try:
            response = self._client.post("/episodes", json=request.submission())
        except httpx.HTTPError as exc:
            raise SubmissionError(f"Orchard Env unreachable submitting {request.episode_id}: {exc}") from exc
        if response.status_code == 409:
            log.info("episode already submitted", episode_id=request.episode_id, group_id=request.group_id)
            return
        if response.status_code >= 300:
            raise SubmissionError(
                f"Orchard Env answered {response.status_code} to episode {request.episode_id}: {response.text[:300]}"
            )

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()


def run_rollout_scheduler(
    bus: Bus,
    config: RolloutSchedulerConfig,
    submit: SubmitFn,
    *,
    stop: threading.Event | None = None,
    codec: Codec | None = None,
    hooks: LockstepHooks | None = None,
) -> RolloutScheduler:
    """Replay the run's outcomes, then run rounds (module docstring) until ``config.rounds`` or ``stop``.

    ``hooks`` are required with ``config.lockstep``; a lockstep wait that passes ``round_timeout_s`` raises
    ``LockstepTimeout``."""
    if config.lockstep and hooks is None:
        raise ValueError("a lockstep rollout needs LockstepHooks (the pipeline's consumer groups to wait for)")
    scheduler = RolloutScheduler(config, submit)
    codec = codec or Codec.default()
    bus.create_topic(config.topic, exist_ok=True)
    consumer = bus.consumer([config.topic], group=None, start="earliest")
    versions = None
    if config.new_policy_wait_s is not None or config.lockstep:
        bus.create_topic(config.versions_topic, exist_ok=True)
        versions = bus.consumer([config.versions_topic], group=None, start="earliest")
    lockstep = None
    if config.lockstep and hooks is not None and versions is not None:
        lockstep = _Lockstep(bus, scheduler, hooks, versions, codec, stop)
    try:
        _replay(bus, consumer, config.topic, scheduler, codec)
        log.info("outcomes replayed", run_id=config.run_id, observed=scheduler.observed, next_round=scheduler.round)
        if lockstep is not None:
            lockstep.recover(lambda: _feed(consumer.poll(timeout_s=_Lockstep.POLL_S), scheduler, codec))
        while not (stop is not None and stop.is_set()):
            if config.rounds is not None and scheduler.rounds_submitted >= config.rounds:
                break
            if scheduler.exhausted:
                break
            if lockstep is not None:
                lockstep.await_trained(scheduler.round - 1)
            elif versions is not None:
                _await_new_policy(versions, scheduler, codec, stop)
            if stop is not None and stop.is_set():
                break
            if not scheduler.submit_round(lockstep.plan if lockstep is not None else None):
                # every task reached max_task_outcomes: later rounds would be empty too, so say so and end here
                log.warning("no task left to roll out: every task has reached max_task_outcomes", run_id=config.run_id,
                            rounds=scheduler.rounds_submitted, of=config.rounds)  # fmt: skip
                scheduler.out_of_tasks = True
                break
            deadline = time.monotonic() + config.round_timeout_s
            while not scheduler.round_done and time.monotonic() < deadline and not (stop and stop.is_set()):
                _feed(consumer.poll(timeout_s=1.0), scheduler, codec)
            if not scheduler.round_done:
                scheduler.timed_out_rounds += 1
                log.warning("round timed out", round=scheduler.round - 1, missing=len(scheduler.outstanding))
            if lockstep is not None and not (stop and stop.is_set()):
                lockstep.announce(scheduler.round - 1, len(scheduler.round_requests))
        if lockstep is not None and scheduler.announced and not (stop and stop.is_set()):
            lockstep.await_trained(max(scheduler.announced))  # the stage ends with its last round trained
    finally:
        consumer.close()
        if versions is not None:
            versions.close()
        if lockstep is not None:
            lockstep.close()
    return scheduler


class LockstepTimeout(RuntimeError):
    """A lockstep wait (the pipeline, the trained version, the engine) passed ``round_timeout_s``."""


class _Lockstep:
    """The waits and the announcements of a lockstep scheduler (module docstring)."""

    POLL_S = 0.2

    def __init__(
        self, bus: Bus, scheduler: RolloutScheduler, hooks: LockstepHooks, versions: Consumer, codec: Codec,
        stop: threading.Event | None,
    ) -> None:  # fmt: skip
        self.bus, self.scheduler, self.hooks, self.codec, self.stop = bus, scheduler, hooks, codec, stop
        self.config = scheduler.config
        self.versions = versions
        bus.create_topic(self.config.rounds_topic, partitions=1, exist_ok=True)
        bus.create_topic(self.config.samples_topic, exist_ok=True)
        self.rounds = bus.consumer([self.config.rounds_topic], group=None, start="earliest")
        self.producer: Producer = bus.producer()

    def close(self) -> None:
        """Close the reader of announced rounds and the producer."""
        self.rounds.close()
        self.producer.close()

    def recover(self, poll_outcomes: Callable[[], None]) -> None:
        """After a restart: read what was planned, announced and trained. A round planned (or with outcomes) but not
        announced is finished first: its outcomes awaited (all its planned episodes), then announced, so a crash
        anywhere in a round loses nothing and never announces a round still running."""
        _replay(self.bus, self.rounds, self.config.rounds_topic, self.scheduler, self.codec)
        _feed(self.versions.poll(timeout_s=0.0), self.scheduler, self.codec)
        scheduler = self.scheduler
        started = set(scheduler.planned) | ({scheduler.last_outcome_round} - {None})
        pending = sorted(r for r in started if r is not None and r not in scheduler.announced)
        for round_index in pending:
            known = sorted(scheduler.outcome_groups.get(round_index, ()))  # no plan read: what its outcomes name
            episodes, groups = scheduler.planned.get(round_index, (0, known))
            log.warning("a round was started but never announced; finishing it", round=round_index, episodes=episodes)

            def ended(round_index: int = round_index, episodes: int = episodes) -> bool:
                poll_outcomes()
                return len(scheduler.outcome_episodes.get(round_index, ())) >= episodes

            if not self._wait(ended, f"the outcomes of round {round_index}'s {episodes} episodes"):
                return
            scheduler.round = max(scheduler.round, round_index + 1)
            scheduler.round_groups = groups
            self.announce(round_index, episodes)

    def plan(self, requests: list[EpisodeRequest]) -> None:
        """Record the round about to be submitted (``complete: false``): what a restarted scheduler waits for."""
        groups = sorted({request.group_id for request in requests})
        self._send(self.scheduler.round, len(requests), groups, complete=False, ends=[])

    def announce(self, round_index: int, episodes: int) -> None:
        """Wait until the pipeline has made the round's samples, then say so (``complete: true``) with where they
        end on the samples topic."""
        started = time.monotonic()
        if not self._wait(self.hooks.pipeline_caught_up, f"the pipeline to make round {round_index}'s samples"):
            return  # stopped: an unannounced round is finished by the next start (recover)
        info = self.bus.describe_topic(self.config.samples_topic)
        ends = [info.end_offsets.get(partition, 0) for partition in range(info.partitions)]
        self._send(round_index, episodes, list(self.scheduler.round_groups), complete=True, ends=ends)
        self.scheduler.announced.add(round_index)
        log.info("rollout round announced", round=round_index, episodes=episodes, samples_end=ends,
                 waited_s=round(time.monotonic() - started, 2))  # fmt: skip

    def _send(self, round_index: int, episodes: int, groups: list[str], *, complete: bool, ends: list[int]) -> None:
        record = {
            "run_id": self.config.run_id,
            "round": round_index,
            "episodes": episodes,
            "group_ids": groups,
            "policy_version": self.scheduler.policy_version,
            "complete": complete,
            "samples_topic": self.config.samples_topic,
            "samples_end_offsets": ends,
            "created_at": now_ms(),
        }
        self.producer.send(self.config.rounds_topic, self.codec.encode("RolloutRound", record),
                           key=self.config.run_id.encode())  # fmt: skip

    def await_trained(self, round_index: int) -> None:
        """Wait for a version trained on ``round_index`` and for the engine to serve it (nothing before round 0)."""
        if round_index < 0:
            return
        started = time.monotonic()

        def trained() -> bool:
            _feed(self.versions.poll(timeout_s=self.POLL_S), self.scheduler, self.codec)
            return self.scheduler.trained(round_index)

        if not self._wait(trained, f"a policy version trained on round {round_index}"):
            return
        version = self.scheduler.trained_round_version
        serves = self.hooks.engine_serves
        if serves is not None and version is not None:
            if not self._wait(lambda: serves(version), f"the engine to serve policy version {version}"):
                return
        log.info("round trained", round=round_index, policy_version=version,
                 waited_s=round(time.monotonic() - started, 2))  # fmt: skip

    def _wait(self, condition: Callable[[], bool], what: str) -> bool:
        """Wait for ``condition``; False if stopped first; ``LockstepTimeout`` after ``round_timeout_s``."""
        deadline = time.monotonic() + self.config.round_timeout_s
        while not condition():
            if self.stop is not None and self.stop.is_set():
                return False
            if time.monotonic() > deadline:
                raise LockstepTimeout(f"lockstep: waited {self.config.round_timeout_s:g} s for {what}")
            time.sleep(self.POLL_S)
        return True


def _await_new_policy(
    versions: Consumer, scheduler: RolloutScheduler, codec: Codec, stop: threading.Event | None
) -> None:
    """Read policy versions until one is newer than the last round's, or ``new_policy_wait_s`` passes."""
    _feed(versions.poll(timeout_s=0.0), scheduler, codec)
    if not scheduler.awaits_new_policy:
        return
    wait_s = scheduler.config.new_policy_wait_s or 0.0
    started = time.monotonic()
    while scheduler.awaits_new_policy and time.monotonic() - started < wait_s and not (stop and stop.is_set()):
        _feed(versions.poll(timeout_s=min(1.0, wait_s)), scheduler, codec)
    waited = round(time.monotonic() - started, 2)
    if scheduler.awaits_new_policy:
        scheduler.rounds_without_new_policy += 1
        log.info("no newer policy version; the round goes ahead", round=scheduler.round, waited_s=waited,
                 policy_version=scheduler.policy_version)  # fmt: skip
    else:
        log.info("newer policy version published", round=scheduler.round, waited_s=waited,
                 policy_version=scheduler.policy_version)  # fmt: skip


def _replay(bus: Bus, consumer: Consumer, topic: str, scheduler: RolloutScheduler, codec: Codec) -> None:
    """Read ``topic`` until every partition's end offset, as of now, is passed (or it goes quiet for a while)."""
    info = bus.describe_topic(topic)
    until = {TopicPartition(topic, p): end for p, end in info.end_offsets.items() if end > info.start_offsets.get(p, 0)}
    _feed(read_until_quiet(consumer, max_records=500, poll_timeout_s=1.0, idle_polls=10, until=until), scheduler, codec)


def _feed(records: Iterable[Record], scheduler: RolloutScheduler, codec: Codec) -> None:
    for record in records:
        try:
            decoded = codec.decode(record.value)
        except SerializationError as exc:
            log.warning("undecodable outcome skipped", partition=record.partition, offset=record.offset, error=str(exc))
            continue
        if decoded.name == "EpisodeOutcome":
            scheduler.observe(decoded.record)
        elif decoded.name == "PolicyVersion":
            scheduler.observe_policy_version(decoded.record)
        elif decoded.name == "RolloutRound":
            scheduler.observe_round(decoded.record)
