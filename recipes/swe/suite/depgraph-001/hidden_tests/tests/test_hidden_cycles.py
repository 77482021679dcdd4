import pytest

from depgraph import CycleError, toposort


def test_cycle_is_reported():
    with pytest.raises(CycleError) as info:
        toposort({"a": ["b"], "b": ["a"], "c": []})
    assert info.value.nodes == ["a", "b"]


def test_self_dependency_is_a_cycle():
    with pytest.raises(CycleError):
        toposort({"x": ["x"]})


def test_diamond_is_fine():
    assert toposort({"d": ["b", "c"], "b": ["a"], "c": ["a"]}) == ["a", "b", "c", "d"]
