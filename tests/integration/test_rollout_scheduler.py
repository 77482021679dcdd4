"""The rollout scheduler over a real bus: submissions answered by outcomes on the ``outcomes`` topic, rounds sized
by Balanced Adaptive Rollout, and a restart that rebuilds its estimates and round counter by replaying the topic."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np

from orchard.bus import Bus
from orchard.codec import Codec
from orchard.episode_requests import EpisodeRequest
from producers.rollout.balanced import BalancedRolloutConfig
from producers.rollout.scheduler import RolloutSchedulerConfig, run_rollout_scheduler

WHEN = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
RATES = {"never": 0.0, "coin": 0.5, "always": 1.0}


class FakeEnv:
    """Stands in for Orchard Env: every submitted episode ends at once with an outcome drawn from its task's rate."""

    def __init__(self, bus: Bus, topic: str, run_id: str, seed: int = 0) -> None:
        self.producer = bus.producer()
        self.topic = topic
        self.run_id = run_id
        self.rng = np.random.default_rng(seed)
        self.submitted: list[EpisodeRequest] = []

    def __call__(self, request: EpisodeRequest) -> None:
        self.submitted.append(request)
        success = bool(self.rng.random() < RATES[request.task_id])
        record = {
            "run_id": self.run_id,
            "episode_id": request.episode_id,
            "task_id": request.task_id,
            "group_id": request.group_id,
            "status": "SUCCEEDED" if success else "FAILED",
            "reward": float(success),
            "success": success,
            "num_model_calls": 1,
            "started_at": WHEN,
            "ended_at": WHEN,
        }
        value = Codec.default().encode("EpisodeOutcome", record)
        self.producer.send(self.topic, value, key=request.episode_id.encode())


def scheduler_config(run_id: str, topic: str, rounds: int) -> RolloutSchedulerConfig:
    return RolloutSchedulerConfig(
        run_id=run_id,
        tasks=sorted(RATES),
        harness="builtin",
        model="policy",
        rollout=BalancedRolloutConfig(budget=12, min_rollouts=2, max_rollouts=16),
        rounds=rounds,
        round_timeout_s=30,
        topic=topic,
    )


def test_scheduler_moves_rollouts_to_the_mixed_task_and_resumes_by_replaying_outcomes(
    bus: Bus, unique_name: Callable[[str], str]
) -> None:
    run_id, topic = unique_name("run"), unique_name("outcomes")
    bus.create_topic(topic, partitions=2)
    env = FakeEnv(bus, topic, run_id)

    first = run_rollout_scheduler(bus, scheduler_config(run_id, topic, rounds=6), env)

    assert first.rounds_submitted == 6 and first.round_done
    last_round = [r for r in env.submitted if r.group_id.startswith("r000005-")]
    assert {task: sum(r.task_id == task for r in last_round) for task in RATES} == {"never": 2, "coin": 8, "always": 2}

    expected_next = first.policy.allocate(sorted(RATES))
    restarted = run_rollout_scheduler(bus, scheduler_config(run_id, topic, rounds=1), env)

    assert restarted.observed == 6 * 12 + 12  # every replayed outcome of the run, then the new round's
    new_round = env.submitted[-12:]
    assert {r.group_id[:8] for r in new_round} == {"r000006-"}
    assert {task: sum(r.task_id == task for r in new_round) for task in RATES} == expected_next
    env.producer.close()
