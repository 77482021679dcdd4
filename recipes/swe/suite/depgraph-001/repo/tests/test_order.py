from depgraph import toposort


def test_chain():
    assert toposort({"app": ["lib"], "lib": ["core"]}) == ["core", "lib", "app"]


def test_independent_nodes_alphabetical():
    assert toposort({"b": [], "a": [], "c": ["a"]}) == ["a", "b", "c"]


def test_empty():
    assert toposort({}) == []
