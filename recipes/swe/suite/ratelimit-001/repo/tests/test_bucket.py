import pytest

from ratelimit import TokenBucket


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_starts_full():
    assert TokenBucket(1, 5, clock=FakeClock()).tokens == 5


def test_rejects_bad_arguments():
    with pytest.raises(ValueError):
        TokenBucket(0, 5)


def test_denies_when_cost_exceeds_tokens():
    bucket = TokenBucket(1, 2, clock=FakeClock())
    assert not bucket.allow(3)


def test_no_wait_when_full():
    assert TokenBucket(1, 2, clock=FakeClock()).wait_time() == 0.0
