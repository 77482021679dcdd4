import pytest

from lrucache import LRUCache


def test_put_and_get():
    cache = LRUCache(2)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("zz", 0) == 0


def test_hit_and_miss_counters():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.get("a")
    cache.get("b")
    assert (cache.hits, cache.misses) == (1, 1)


def test_size_never_exceeds_capacity():
    cache = LRUCache(2)
    for i in range(5):
        cache.put(i, i)
    assert len(cache) == 2


def test_invalid_capacity():
    with pytest.raises(ValueError):
        LRUCache(0)
