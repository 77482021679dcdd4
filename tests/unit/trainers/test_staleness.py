"""The staleness rule: lag against the trainer's version, drop or down-weight past max_policy_lag."""

from __future__ import annotations

from trainers.staleness import LagStats, StalenessCheck, Verdict


def test_no_limit_keeps_every_sample_at_full_weight() -> None:
    assert StalenessCheck().judge(sample_version=0, current_version=100) == Verdict(100, True, 1.0)


def test_samples_past_the_lag_limit_are_dropped() -> None:
    check = StalenessCheck(max_policy_lag=2, policy="drop")
    assert [check.judge(v, 5) for v in (5, 3, 2, 0)] == [
        Verdict(0, True, 1.0),
        Verdict(2, True, 1.0),
        Verdict(3, False, 0.0),
        Verdict(5, False, 0.0),
    ]


def test_samples_past_the_lag_limit_are_downweighted_geometrically() -> None:
    check = StalenessCheck(max_policy_lag=1, policy="downweight", decay=0.5)
    assert [check.judge(v, 4).weight for v in (4, 3, 2, 1, 0)] == [1.0, 1.0, 0.5, 0.25, 0.125]


def test_a_sample_newer_than_the_trainer_has_lag_zero() -> None:
    assert StalenessCheck(max_policy_lag=0).judge(sample_version=7, current_version=3) == Verdict(0, True, 1.0)


def test_lag_stats_count_dropped_and_downweighted() -> None:
    stats = LagStats()
    for verdict in (Verdict(0, True, 1.0), Verdict(3, False, 0.0), Verdict(2, True, 0.5)):
        stats.add(verdict)
    assert (stats.count, stats.mean, stats.maximum, stats.dropped, stats.downweighted) == (3, 5 / 3, 3, 1, 1)
