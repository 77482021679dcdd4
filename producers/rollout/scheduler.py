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
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from orchard.bus import Bus, Consumer, Record, TopicPartition, read_until_quiet
from orchard.codec import Codec
from orchard.episode_requests import EpisodeRequest, SubmitFn
from orchard.logging import get_logger
from orchard.serialization_errors import SerializationError
from orchard.topics import OUTCOMES, POLICY_VERSIONS
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


def group_id_for(round_index: int, task_id: str) -> str:
    """The group id of ``task_id``'s episodes in round ``round_index``."""
    return f"r{round_index:06d}-{task_id}"


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
        return True

    def observe_policy_version(self, version: Mapping[str, Any]) -> bool:
        """Fold in one decoded ``PolicyVersion``; False for another run's (ignored)."""
        if version["run_id"] != self.config.run_id:
            return False
        self.policy_version = max(int(version["version"]), -1 if self.policy_version is None else self.policy_version)
        return True

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
                        options=self.config.options,
                    )
                )
        return requests

    def submit_round(self) -> list[EpisodeRequest]:
        """Plan the next round, submit every episode of it, and wait for their outcomes from now on."""
        requests = self.plan_round()
        if self.config.max_episodes is not None:
            requests = requests[: max(0, self.config.max_episodes - self.submitted)]
        for request in requests:
            self.submit(request)
        self.outstanding = {request.episode_id for request in requests}
        sizes = {request.group_id: 0 for request in requests}
        for request in requests:
            sizes[request.group_id] += 1
        log.info("rollout round submitted", run_id=self.config.run_id, round=self.round, groups=sizes,
                 policy_version=self.policy_version)  # fmt: skip
        self.round_policy_version = self.policy_version
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
) -> RolloutScheduler:
    """Replay the run's outcomes, then run rounds (module docstring) until ``config.rounds`` or ``stop``."""
    scheduler = RolloutScheduler(config, submit)
    codec = codec or Codec.default()
    bus.create_topic(config.topic, exist_ok=True)
    consumer = bus.consumer([config.topic], group=None, start="earliest")
    versions = None
    if config.new_policy_wait_s is not None:
        bus.create_topic(config.versions_topic, exist_ok=True)
        versions = bus.consumer([config.versions_topic], group=None, start="earliest")
    try:
        _catch_up(bus, consumer, scheduler, codec)
        log.info("outcomes replayed", run_id=config.run_id, observed=scheduler.observed, next_round=scheduler.round)
        while not (stop is not None and stop.is_set()):
            if config.rounds is not None and scheduler.rounds_submitted >= config.rounds:
                break
            if scheduler.exhausted:
                break
            if versions is not None:
                _await_new_policy(versions, scheduler, codec, stop)
            if not scheduler.submit_round():
                # every task reached max_task_outcomes: later rounds would be empty too, so say so and end here
                log.warning("no task left to roll out: every task has reached max_task_outcomes", run_id=config.run_id,
                            rounds=scheduler.rounds_submitted - 1, of=config.rounds)  # fmt: skip
                scheduler.rounds_submitted -= 1
                scheduler.out_of_tasks = True
                break
            deadline = time.monotonic() + config.round_timeout_s
            while not scheduler.round_done and time.monotonic() < deadline and not (stop and stop.is_set()):
                _feed(consumer.poll(timeout_s=1.0), scheduler, codec)
            if not scheduler.round_done:
                scheduler.timed_out_rounds += 1
                log.warning("round timed out", round=scheduler.round - 1, missing=len(scheduler.outstanding))
    finally:
        consumer.close()
        if versions is not None:
            versions.close()
    return scheduler


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


def _catch_up(bus: Bus, consumer: Consumer, scheduler: RolloutScheduler, codec: Codec) -> None:
    """Read until every partition's end offset, as of now, is passed (or the topic goes quiet for a while)."""
    topic = scheduler.config.topic
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
