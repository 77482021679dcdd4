"""The rollout scheduler: sizes each task's rollout group from past outcomes and submits episodes to Orchard Env.

- ``balanced``: Balanced Adaptive Rollout, the allocation rule (pure logic and its state);
- ``simulate``: a self-contained simulation of the rule against uniform allocation (no Env, no bus);
- ``scheduler``: the loop that reads ``outcomes``, asks the rule for the next round and submits the episodes.

Nothing here imports torch: the scheduler runs beside the control plane.
"""

from producers.rollout.balanced import BalancedRollout, BalancedRolloutConfig, TaskEstimate, expected_mixed_probability

__all__ = ["BalancedRollout", "BalancedRolloutConfig", "TaskEstimate", "expected_mixed_probability"]
