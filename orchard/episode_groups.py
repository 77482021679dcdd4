"""Rollout-group ids that mean something to every component: held-out evaluation episodes are never trained on.

Evaluation episodes run through the same Env, proxy and topics as training ones (so they are measured exactly as
they are trained), and their ``group_id`` starts with ``EVAL_GROUP_PREFIX``; consumers that build training data
skip them.
"""

from __future__ import annotations

EVAL_GROUP_PREFIX = "eval-"


def is_eval_group(group_id: str) -> bool:
    """Whether ``group_id`` is a held-out evaluation group (never a source of training data)."""
    return group_id.startswith(EVAL_GROUP_PREFIX)


def demo_episode_id(task_id: str, index: int) -> str:
    """The id of demonstration ``index`` of a task, as the recipes' scripted experts name their plans
    (``orchard rollout run --demos`` submits it in group ``demo-<task_id>``)."""
    return f"demo-{task_id}-{index}"


def stream_key(task_id: str) -> str:
    """The bus key of an episode's ``Trajectory`` and ``StepScore`` records: its task.

    A rollout group's members are one task's episodes, so keying both topics by task sends a whole group, and
    every score of it, to one partition number; with the topics' partition counts equal and a co-partitioning
    assignment (Kafka's range assignor, the embedded log's groups), one instance of a consumer group sees all a
    group needs, and the sample builder and group-level reward plug-ins run as several instances. (Keys by episode
    would scatter a group over the partitions.)

    >>> stream_key("file-lookup-train-00204")
    'file-lookup-train-00204'
    """
    return task_id
