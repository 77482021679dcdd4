"""The paired exact McNemar test of each stage against the stage before it: the p-value against a brute-force
enumeration, pairing by task id (tasks of one stage only left out and counted), and the results table's columns."""

from __future__ import annotations

import doctest
import itertools
import json
from fractions import Fraction
from pathlib import Path

import pytest

from orchard.evaluation import paired, results
from orchard.evaluation.heldout import EpisodeResult, HeldoutResult, TaskResult
from orchard.evaluation.paired import PairedTest, mcnemar_exact_p, paired_test
from orchard.evaluation.results import read_rows, record_stage, render_markdown
from orchard.evaluation.stats import mean_stats, success_stats


def brute_force_p(wins: int, losses: int) -> Fraction:
    """P(a fair-coin split of the n discordant pairs is at least as lopsided as the one observed), by enumerating
    all 2**n splits: an independent route to the two-sided exact p-value."""
    n = wins + losses
    observed = abs(wins - losses)
    splits = list(itertools.product((0, 1), repeat=n))
    extreme = sum(1 for split in splits if abs(2 * sum(split) - n) >= observed)
    return Fraction(extreme, len(splits))


@pytest.mark.parametrize(("wins", "losses"), [(0, 0), (1, 0), (0, 5), (8, 1), (3, 3), (7, 5), (2, 10), (12, 0)])
def test_the_exact_p_value_equals_the_enumerated_one(wins: int, losses: int) -> None:
    assert mcnemar_exact_p(wins, losses) == float(brute_force_p(wins, losses))


def test_the_exact_p_value_of_large_splits_stays_exact_and_symmetric() -> None:
    # 600 discordant pairs: 2**600 overflows a float, the integer arithmetic must not
    assert mcnemar_exact_p(320, 280) == mcnemar_exact_p(280, 320)
    assert 0.1 < mcnemar_exact_p(320, 280) < 0.12  # normal approximation: 2 * (1 - Phi(39.5 / sqrt(150))) = 0.111
    assert mcnemar_exact_p(400, 200) < 1e-15
    with pytest.raises(ValueError, match="non-negative"):
        mcnemar_exact_p(-1, 3)


def test_pairs_are_tasks_both_stages_evaluated_and_only_discordant_ones_count() -> None:
    before = {"a": True, "b": False, "c": False, "d": True, "only-before": False}
    after = {"a": True, "b": True, "c": True, "d": False, "only-after": True}

    assert paired_test("sft", before, after) == PairedTest("sft", pairs=4, wins=2, losses=1, p_value=1.0)


def stage(name: str, outcomes: dict[str, bool]) -> HeldoutResult:
    """A stage's result, one episode per task, reward = success."""
    episodes = [
        EpisodeResult(f"{name}-{task}", task, 0, "SUCCEEDED" if won else "FAILED", won, float(won))
        for task, won in outcomes.items()
    ]
    wins = [e.success for e in episodes]
    return HeldoutResult(
        stage=name,
        run_id="run",
        samples_per_task=1,
        tasks=[TaskResult(e.task_id, [e], e) for e in episodes],
        success=success_stats(sum(wins), len(wins)),
        reward=mean_stats([e.reward for e in episodes]),
        wall_time_s=1.0,
        mean_success=sum(wins) / len(wins),
        any_success=sum(wins) / len(wins),
    )


def tasks(solved: str, all_tasks: str = "abcdefghij") -> dict[str, bool]:
    """Outcomes of tasks named by the letters of ``all_tasks``, solved when their letter is in ``solved``."""
    return {task: task in solved for task in all_tasks}


def test_every_row_is_compared_with_the_row_before_it_by_task_id(tmp_path: Path) -> None:
    record_stage(tmp_path, stage("sft", tasks("ab")))
    record_stage(tmp_path, stage("rl", tasks("abcdefghi")))  # 7 wins, no loss
    rows = record_stage(tmp_path, stage("dense", tasks("bcd", "bcdefghijk")))  # k is new, a was not evaluated

    assert [(r.stage, r.vs_stage, r.pairs, r.wins, r.losses) for r in rows] == [
        ("sft", None, None, None, None), ("rl", "sft", 10, 7, 0), ("dense", "rl", 9, 0, 5),
    ]  # fmt: skip
    assert [r.p_value for r in rows] == [None, 2 / 2**7, 2 / 2**5]
    assert rows[2].task_outcomes == tasks("bcd", "bcdefghijk")
    assert read_rows(tmp_path) == rows
    saved = json.loads((tmp_path / "results.json").read_text())["stages"][1]
    assert {k: saved[k] for k in ("vs_stage", "pairs", "wins", "losses", "p_value")} == {
        "vs_stage": "sft", "pairs": 10, "wins": 7, "losses": 0, "p_value": 0.015625,
    }  # fmt: skip
    assert render_markdown(rows).splitlines()[2:6] == [
        "| sft | first | 10 | 20.0% (2/10) | [5.7%, 51.0%] | - | - | 20.0% | 0.200 [-0.061, 0.461] | - | - | 1.0 |",
        "| rl | first | 10 | 90.0% (9/10) | [59.6%, 98.2%] | +7/-0 of 10 | 0.016 | 90.0% | 0.900 [0.704, 1.096] "
        "| - | - | 1.0 |",
        "| dense | first | 10 | 30.0% (3/10) | [10.8%, 60.3%] | +0/-5 of 9 | 0.062 | 30.0% | 0.300 [0.001, 0.599] "
        "| - | - | 1.0 |",
        "",
    ]
    assert "- dense vs rl: 9 of its 10 tasks paired (the others were not evaluated in both stages)" in (
        render_markdown(rows).splitlines()
    )


def test_evaluating_a_stage_again_updates_the_comparison_of_the_stage_after_it(tmp_path: Path) -> None:
    record_stage(tmp_path, stage("sft", tasks("ab")))
    record_stage(tmp_path, stage("rl", tasks("abc")))
    rows = record_stage(tmp_path, stage("sft", tasks("abcd")))

    assert [(r.stage, r.vs_stage, r.wins, r.losses) for r in rows] == [("sft", None, None, None), ("rl", "sft", 0, 1)]


def test_rows_of_an_older_table_take_their_outcomes_from_the_stage_detail(tmp_path: Path) -> None:
    record_stage(tmp_path, stage("sft", tasks("ab")))
    record_stage(tmp_path, stage("rl", tasks("abcde")))
    data = json.loads((tmp_path / "results.json").read_text())
    for row in data["stages"]:  # as an older Orchard wrote it: no outcomes, no comparison
        for key in ("task_outcomes", "vs_stage", "pairs", "wins", "losses", "p_value"):
            del row[key]
    (tmp_path / "results.json").write_text(json.dumps(data))
    (tmp_path / "eval" / "rl.json").unlink()

    rows = read_rows(tmp_path)
    assert (rows[0].task_outcomes, rows[1].task_outcomes) == (tasks("ab"), None)
    rows = record_stage(tmp_path, stage("dense", tasks("a")))
    assert [(r.stage, r.vs_stage, r.wins, r.losses) for r in rows] == [
        ("sft", None, None, None), ("rl", None, None, None), ("dense", None, None, None),
    ]  # fmt: skip
    rows = record_stage(tmp_path, stage("rl", tasks("abcde")))
    assert [(r.stage, r.vs_stage, r.pairs, r.wins, r.losses) for r in rows] == [
        ("sft", None, None, None, None), ("rl", "sft", 10, 3, 0), ("dense", "rl", 10, 0, 4),
    ]  # fmt: skip


@pytest.mark.parametrize("module", [paired, results])
def test_the_doctests_hold(module: object) -> None:
    outcome = doctest.testmod(module, raise_on_error=False)  # type: ignore[arg-type]
    assert (outcome.failed, outcome.attempted > 0) == (0, True)
