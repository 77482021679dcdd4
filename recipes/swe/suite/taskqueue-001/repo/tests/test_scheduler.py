import pytest

from taskqueue import Scheduler


def test_lower_priority_first():
    s = Scheduler()
    s.submit("later", 5)
    s.submit("sooner", 1)
    assert s.drain() == ["sooner", "later"]


def test_pop_empty():
    with pytest.raises(IndexError):
        Scheduler().pop()


def test_len():
    s = Scheduler()
    s.submit("x")
    assert len(s) == 1
