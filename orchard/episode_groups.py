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
