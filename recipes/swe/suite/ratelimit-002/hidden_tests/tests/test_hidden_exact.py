from ratelimit import TokenBucket


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_whole_capacity_can_be_used():
    bucket = TokenBucket(rate=1, capacity=3, clock=FakeClock())
    assert [bucket.allow() for _ in range(4)] == [True, True, True, False]


def test_cost_equal_to_tokens_is_allowed():
    bucket = TokenBucket(rate=1, capacity=5, clock=FakeClock())
    assert bucket.allow(5)
    assert bucket.tokens == 0


def test_wait_time_after_draining():
    clock = FakeClock()
    bucket = TokenBucket(rate=2, capacity=1, clock=clock)
    bucket.allow(0.5)
    assert bucket.wait_time() == 0.25
