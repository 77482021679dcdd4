"""The red team: every attack of the catalogue runs as the harness of a real episode (scheduler, local sandbox as
root, recording proxy, the recipes' graders) and must earn nothing and leave the host as it was. Two controls first:
an honest solution of each task is rewarded, so a zero for an attack means the attack failed, not the grader."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchard.env.scheduler import EpisodeState
from tests.security.attack import Attack, RedTeamResults
from tests.security.catalogue import ATTACKS
from tests.security.stack import RedTeamStack, ran

pytestmark = [pytest.mark.security, pytest.mark.harness, pytest.mark.slow]


def honest(red_team: RedTeamStack, kind: str) -> Attack:
    """A harness that solves the task the way an agent should (the controls)."""
    if kind == "lookup":
        words = red_team.tasks.get(red_team.task_ids["lookup"]).instruction.split()  # Write the value of K in F to ..
        script = f"sed -n 's/^{words[4]}: //p' {words[6]} > answer.txt"
        return Attack("honest", "control", "lookup", script)
    return Attack("honest", "control", "swe", "sed -i 's/factor \\*\\* (i + 1)/factor ** i/' retry/policy.py")


@pytest.mark.parametrize("kind", ["lookup", "swe"])
def test_an_honest_solution_is_rewarded(red_team: RedTeamStack, kind: str) -> None:
    evidence = red_team.run(honest(red_team, kind))
    assert evidence.episode.state == EpisodeState.SUCCEEDED, (evidence.episode.error, evidence.episode.result,
                                                             evidence.output[-2000:])  # fmt: skip
    assert evidence.episode.result["reward"] == 1.0
    assert red_team.host_changes(evidence) == []


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda attack: attack.id)
def test_an_attack_earns_nothing_and_leaves_the_host_unchanged(
    red_team: RedTeamStack, red_team_results: RedTeamResults, attack: Attack
) -> None:
    evidence = red_team.run(attack)
    if not ran(evidence):
        why = f"{evidence.episode.state.value}: {evidence.episode.error}"
        red_team_results.not_run.append((attack, why))
        pytest.fail(f"the attack never started: {why}")
    breaches = red_team.judge(evidence)
    red_team_results.tried.append((attack, breaches))
    if log_dir := os.environ.get("ORCHARD_REDTEAM_LOG"):  # what each attack saw, for whoever fixes the sandbox
        summary = f"{attack.id}: {evidence.episode.state.value} {evidence.episode.result} {evidence.episode.error}"
        text = "\n".join([summary, *breaches, "-" * 40, evidence.output])
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        Path(log_dir, f"{attack.slug}.txt").write_text(text)
    assert breaches == [], f"{attack.id} ({attack.doc}) succeeded:\n" + "\n".join(breaches)
