from ratelimit import TokenBucket


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_refill_counts_each_second_once():
    clock = FakeClock()
    bucket = TokenBucket(rate=1, capacity=10, clock=clock)
    for _ in range(10):
        assert bucket.allow()
    clock.now = 2.0
    assert bucket.allow()
    assert bucket.allow()
    assert not bucket.allow()


def test_sustained_rate_is_respected():
    clock = FakeClock()
    bucket = TokenBucket(rate=2, capacity=2, clock=clock)
    allowed = 0
    for step in range(1, 11):
        clock.now = step * 0.5
        allowed += bucket.allow() + bucket.allow()
    assert allowed == 2 + 9


def test_burst_up_to_capacity():
    bucket = TokenBucket(rate=1, capacity=3, clock=FakeClock())
    assert [bucket.allow() for _ in range(4)] == [True, True, True, False]
