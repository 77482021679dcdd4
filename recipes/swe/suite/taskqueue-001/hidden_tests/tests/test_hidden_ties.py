from taskqueue import Scheduler


def test_equal_priorities_run_in_submission_order():
    s = Scheduler()
    for name in ["write", "build", "deploy"]:
        s.submit(name, 1)
    assert s.drain() == ["write", "build", "deploy"]


def test_uncomparable_tasks_with_same_priority():
    s = Scheduler()
    s.submit({"job": 1}, 0)
    s.submit({"job": 2}, 0)
    assert s.drain() == [{"job": 1}, {"job": 2}]


def test_mixed_priorities():
    s = Scheduler()
    s.submit("c", 3)
    s.submit("a", 1)
    s.submit("b", 2)
    assert s.drain() == ["a", "b", "c"]
