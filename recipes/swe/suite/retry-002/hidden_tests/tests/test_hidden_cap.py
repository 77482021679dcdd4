from retry import backoff_delays, retry


def test_schedule_is_capped():
    assert backoff_delays(5, base=1.0, factor=10.0, max_delay=30.0) == [1.0, 10.0, 30.0, 30.0]


def test_runner_honours_max_delay():
    slept = []

    def fail():
        raise TimeoutError

    try:
        retry(fail, attempts=4, base=2.0, factor=4.0, max_delay=10.0, sleep=slept.append)
    except TimeoutError:
        pass
    assert slept == [2.0, 8.0, 10.0]


def test_uncapped_schedule():
    assert backoff_delays(3, base=1.0, factor=2.0) == [1.0, 2.0]
