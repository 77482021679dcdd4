from retry import backoff_delays, retry


def test_first_delay_is_base():
    assert backoff_delays(4, base=1.0, factor=2.0) == [1.0, 2.0, 4.0]


def test_runner_sleeps_schedule():
    slept = []

    def fail():
        raise OSError

    try:
        retry(fail, attempts=3, base=0.5, factor=3.0, sleep=slept.append)
    except OSError:
        pass
    assert slept == [0.5, 1.5]


def test_single_attempt_has_no_delays():
    assert backoff_delays(1) == []
