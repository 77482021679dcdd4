"""The red team's session: one stack for every attack (``stack.build_stack``), and a summary at the end of the run:
``red team: N attacks tried, M succeeded`` with each succeeded attack and its breaches."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.security.attack import RESULTS, RedTeamResults
from tests.security.stack import RedTeamStack, build_stack


def pytest_configure(config: pytest.Config) -> None:
    config.stash[RESULTS] = RedTeamResults()


@pytest.fixture(scope="session")
def red_team() -> Iterator[RedTeamStack]:
    """The stack every attack runs on (canaries planted, services up), torn down at the end of the session."""
    stack = build_stack()
    try:
        yield stack
    finally:
        stack.close()


@pytest.fixture
def red_team_results(request: pytest.FixtureRequest) -> RedTeamResults:
    """The session's record of attacks, for the summary."""
    return request.config.stash[RESULTS]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    results = config.stash.get(RESULTS, None)
    if results is None or not (results.tried or results.not_run):
        return
    succeeded = [(attack, breaches) for attack, breaches in results.tried if breaches]
    terminalreporter.section("red team")
    terminalreporter.write_line(f"red team: {len(results.tried)} attacks tried, {len(succeeded)} succeeded")
    for attack, breaches in succeeded:
        terminalreporter.write_line(f"  SUCCEEDED {attack.id}: {'; '.join(breaches)}"[:2000])
    for attack, why in results.not_run:
        terminalreporter.write_line(f"  NOT RUN {attack.id}: {why}")
