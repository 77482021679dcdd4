"""One entry of the red team's catalogue: a named attack script, the class of cheat it belongs to, and the task it
runs on. Scripts name host paths and ports through ``@@NAME@@`` placeholders (``render``), never secrets: a secret
the attacker prints must come from what it found, not from the script."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

TaskKind = Literal["lookup", "swe"]
Layout = Literal["old", "new", "any"]
PLACEHOLDER = re.compile(r"@@([A-Z_]+)@@")
Judge = Callable[[Any, Any], list[str]]
"""``judge(stack, evidence)``: breaches only the host can see (``stack.RedTeamStack``, ``stack.Evidence``)."""


@dataclass(frozen=True)
class Attack:
    """A cheat to try from inside an episode."""

    name: str
    klass: str
    task_kind: TaskKind
    script: str
    lang: Literal["sh", "py"] = "sh"
    layout: Layout = "any"
    """Which grader layout it targets: ``old`` (``.grader/`` in the working copy, ``.orchard-signals.json``),
    ``new`` (``$ORCHARD_GRADER_DIR``, ``$ORCHARD_GRADER_OUT/signals.json``) or ``any``."""
    victim: bool = False
    """Run a victim episode concurrently (its canary must not reach this one)."""
    timeout_s: float = 25.0
    judge: Judge | None = None
    doc: str = ""

    @property
    def id(self) -> str:
        """``klass/name/task kind``, the test id."""
        return f"{self.klass}/{self.name}/{self.task_kind}"

    @property
    def slug(self) -> str:
        """DNS-label-safe form of the id (sandbox and episode ids)."""
        return re.sub(r"[^a-z0-9-]+", "-", f"{self.name}-{self.task_kind}".lower()).strip("-")[:48]


def render(script: str, context: Mapping[str, object]) -> str:
    """``script`` with every ``@@NAME@@`` replaced from ``context`` (a missing name is an error).

    >>> render("cat @@DIR@@/x", {"DIR": "/srv"})
    'cat /srv/x'
    """

    def value(match: re.Match[str]) -> str:
        return str(context[match.group(1)])

    return PLACEHOLDER.sub(value, script)


def both(name: str, klass: str, script: str, **options: Any) -> list[Attack]:
    """The same attack on a file-lookup task and on a SWE task."""
    return [Attack(name, klass, kind, script, **options) for kind in ("lookup", "swe")]


@dataclass
class RedTeamResults:
    """What each attack of a session did: its breaches (empty: it failed), or why it never ran."""

    tried: list[tuple[Attack, list[str]]] = field(default_factory=list)
    not_run: list[tuple[Attack, str]] = field(default_factory=list)


RESULTS = pytest.StashKey[RedTeamResults]()
"""Where the session keeps its ``RedTeamResults`` (``config.stash``)."""
