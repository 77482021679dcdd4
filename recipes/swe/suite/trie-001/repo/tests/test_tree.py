from trie import Trie


def test_insert_and_contains():
    t = Trie()
    t.insert("car")
    assert "car" in t
    assert "ca" not in t


def test_starts_with():
    t = Trie()
    for w in ["car", "cat", "dog"]:
        t.insert(w)
    assert t.starts_with("ca") == ["car", "cat"]


def test_remove_missing():
    assert Trie().remove("x") is False


def test_duplicate_insert_counted_once():
    t = Trie()
    t.insert("a")
    t.insert("a")
    assert len(t) == 1
