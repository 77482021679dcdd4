import pytest

from retry import retry


def flaky(failures):
    calls = []

    def func():
        calls.append(1)
        if len(calls) <= failures:
            raise ConnectionError("down")
        return len(calls)

    return func


def test_succeeds_after_failures():
    assert retry(flaky(2), attempts=3, sleep=lambda s: None) == 3


def test_gives_up_and_reraises():
    with pytest.raises(ConnectionError):
        retry(flaky(5), attempts=2, sleep=lambda s: None)


def test_other_errors_not_retried():
    def boom():
        raise KeyError("x")

    with pytest.raises(KeyError):
        retry(boom, retry_on=(ConnectionError,), sleep=lambda s: None)
