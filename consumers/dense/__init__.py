"""Dense-reward plug-ins, registered by name for ``orchard consumer run NAME`` (importing this package registers them):

- ``distillation``: on-policy distillation, a teacher engine's per-token reverse KL (``consumers.dense.distillation``);
- ``process_reward``: a judge model's verdict on each step, through an engine (``consumers.dense.process_reward``);
- ``rule_process_reward``: rules rewarding writing and running tests and verifying a fix, penalising loops and no-ops.

Each reads its settings from the environment (``consumers.dense.settings``: ``ORCHARD_DISTILLATION_*``,
``ORCHARD_PRM_*``, ``ORCHARD_RULE_PRM_*``).
"""

from __future__ import annotations

from consumers.dense.distillation import OnPolicyDistillation
from consumers.dense.process_reward import EngineProcessReward, RuleProcessReward
from consumers.rewards import register_reward, registered_rewards

__all__ = ["EngineProcessReward", "OnPolicyDistillation", "RuleProcessReward"]

for _plugin in (OnPolicyDistillation, EngineProcessReward, RuleProcessReward):
    if _plugin.name not in registered_rewards():  # a re-import (importlib test mode) must not register twice
        register_reward(_plugin.name)(_plugin)
