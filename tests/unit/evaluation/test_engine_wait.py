"""Waiting for the engine to serve the newest policy version: what ``/healthz`` says, and the wait's two endings."""

from __future__ import annotations

import httpx
import pytest

from orchard.evaluation import engine_wait
from orchard.evaluation.engine_wait import served_version, wait_until_served

CLIENT = httpx.Client  # the real class, before a test puts a fake in the module's place


def client_answering(versions: list[int | None]) -> httpx.Client:
    """A client whose engine reports each of ``versions`` in turn (None: it is not up yet), then the last one."""

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/healthz"
        version = versions.pop(0) if len(versions) > 1 else versions[0]
        if version is None:
            return httpx.Response(503)
        return httpx.Response(200, json={"status": "ok", "policy_version": version})

    return CLIENT(transport=httpx.MockTransport(handler))


def test_served_version_reads_healthz_and_is_none_while_the_engine_does_not_answer() -> None:
    assert served_version("http://engine/", client_answering([4])) == 4
    assert served_version("http://engine", client_answering([None])) is None
    with httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, json={}))) as client:
        assert served_version("http://engine", client) is None

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with httpx.Client(transport=httpx.MockTransport(refuse)) as client:
        assert served_version("http://engine", client) is None


def test_the_wait_ends_once_the_engine_serves_the_newest_version(monkeypatch: pytest.MonkeyPatch) -> None:
    versions: list[int | None] = [None, 1, 1, 2]
    monkeypatch.setattr(engine_wait.httpx, "Client", lambda **_: client_answering(versions))
    assert wait_until_served("http://engine", lambda: 2, timeout_s=10, poll_s=0) == 2


def test_nothing_published_means_any_version_will_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_wait.httpx, "Client", lambda **_: client_answering([0]))
    assert wait_until_served("http://engine", lambda: None, timeout_s=10, poll_s=0) == 0


def test_the_wait_gives_up_after_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_wait.httpx, "Client", lambda **_: client_answering([1]))
    assert wait_until_served("http://engine", lambda: 3, timeout_s=0.05, poll_s=0.01) is None


def test_an_evaluation_of_one_version_waits_for_it_and_refuses_an_engine_serving_a_newer_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from orchard.cli.train_value import _wait_for_engine
    from orchard.config import OrchardConfig
    from orchard.exceptions import OrchardError

    config = OrchardConfig(run_id="r1")  # not read: the version is given, so the bus is not asked for the newest
    monkeypatch.setattr(engine_wait.httpx, "Client", lambda **_: client_answering([None, 3, 5]))
    _wait_for_engine("http://engine", config, timeout_s=10, version=5)  # 3 is older: it waits, and 5 will do
    monkeypatch.setattr(engine_wait.httpx, "Client", lambda **_: client_answering([7]))
    with pytest.raises(OrchardError, match=r"serves version 7; pin it with .*--max-version 5"):
        _wait_for_engine("http://engine", config, timeout_s=10, version=5)
    monkeypatch.setattr(engine_wait.httpx, "Client", lambda **_: client_answering([3]))  # v5 was never stored
    with pytest.raises(OrchardError, match=r"did not serve it within 0.2s; it serves version 3 \(is v5 in the store"):
        _wait_for_engine("http://engine", config, timeout_s=0.2, version=5)
