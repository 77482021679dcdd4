from trie import Trie


def test_removing_prefix_word_keeps_longer_word():
    t = Trie()
    t.insert("car")
    t.insert("cart")
    assert t.remove("car")
    assert "cart" in t
    assert t.starts_with("ca") == ["cart"]


def test_removing_longer_word_keeps_prefix_word():
    t = Trie()
    t.insert("car")
    t.insert("cart")
    t.remove("cart")
    assert "car" in t
    assert len(t) == 1
