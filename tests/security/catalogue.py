"""Every attack of the red team, by class: grading, reading, network, system (resources, kernel, host)."""

from __future__ import annotations

from tests.security.attack import Attack
from tests.security.attacks_grading import GRADING_ATTACKS
from tests.security.attacks_network import NETWORK_ATTACKS
from tests.security.attacks_reading import READING_ATTACKS
from tests.security.attacks_system import SYSTEM_ATTACKS

ATTACKS: list[Attack] = [*GRADING_ATTACKS, *READING_ATTACKS, *NETWORK_ATTACKS, *SYSTEM_ATTACKS]
assert len({a.id for a in ATTACKS}) == len(ATTACKS), "attack ids must be unique"
assert len({a.slug for a in ATTACKS}) == len(ATTACKS), "attack slugs must be unique"
