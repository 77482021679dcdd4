"""Orchard's standard topics: name, the record schema each carries, and sensible creation defaults."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A standard topic: its name, the schema of its records, and how it is created."""

    name: str
    schema: str
    description: str
    partitions: int | None = None
    config: dict[str, str] = field(default_factory=dict)


MODEL_CALLS = "model-calls"
OUTCOMES = "outcomes"
SCORES = "scores"
SAMPLES = "samples"
TRAJECTORIES = "trajectories"
POLICY_VERSIONS = "policy-versions"
SANDBOX_EVENTS = "sandbox-events"
ROLLOUT_ROUNDS = "rollout-rounds"
DEAD_LETTERS = "dead-letters"

STANDARD_TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(MODEL_CALLS, "ModelCall", "every model call, token-exact, keyed by episode id"),
    TopicSpec(OUTCOMES, "EpisodeOutcome", "one outcome per episode, keyed by episode id"),
    TopicSpec(TRAJECTORIES, "Trajectory", "assembled episodes (calls in order + outcome), keyed by task"),
    TopicSpec(SCORES, "StepScore", "reward consumers' scores of calls or token spans, keyed by task"),
    TopicSpec(SAMPLES, "TrainingSample", "training samples for the policy and value trainers"),
    TopicSpec(POLICY_VERSIONS, "PolicyVersion", "published weights, in order", partitions=1),
    TopicSpec(SANDBOX_EVENTS, "SandboxEvent", "exec and file operations in sandboxes"),
    TopicSpec(ROLLOUT_ROUNDS, "RolloutRound", "lockstep rollout rounds whose samples are complete", partitions=1),
    TopicSpec(DEAD_LETTERS, "DeadLetter", "records that could not be decoded, with the reason"),
)

TOPICS_BY_NAME = {spec.name: spec for spec in STANDARD_TOPICS}
