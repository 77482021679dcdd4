"""The ``orchard`` command as a user runs it: the installed console script, on embedded defaults in a temp dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ORCHARD = str(Path(sys.executable).with_name("orchard"))


def orchard(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed ``orchard`` command in ``cwd`` (so ``.orchard/`` lands there)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")}
    return subprocess.run(
        [ORCHARD, *args], cwd=cwd, env={**clean, **(env or {})}, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory in which ``orchard demo --calls 6`` has run once."""
    cwd = tmp_path_factory.mktemp("demo")
    result = orchard("demo", "--calls", "6", cwd=cwd)
    assert result.returncode == 0, result.stderr
    return cwd


def test_demo_records_replays_and_verifies_on_embedded_defaults(demo_dir: Path) -> None:
    result = orchard("demo", "--calls", "6", cwd=demo_dir)
    assert result.returncode == 0, result.stderr
    assert "6/6" in result.stdout
    assert "SUCCEEDED" in result.stdout
    assert "v2" in result.stdout  # the second run publishes the next policy version
    assert (demo_dir / ".orchard" / "bus" / "topics" / "model-calls").is_dir()


def test_topics_list_and_describe_show_what_the_demo_wrote(demo_dir: Path) -> None:
    listing = orchard("topics", "list", cwd=demo_dir)
    assert listing.returncode == 0, listing.stderr
    rows = {line.split("│")[1].strip(): line for line in listing.stdout.splitlines() if line.count("│") >= 4}
    assert set(rows) >= {"model-calls", "outcomes", "policy-versions", "dead-letters"}
    described = orchard("topics", "describe", "policy-versions", cwd=demo_dir)
    assert "partitions=1" in described.stdout and "PolicyVersion" in described.stdout


def test_tail_prints_json_lines_with_token_arrays_unpacked(demo_dir: Path) -> None:
    result = orchard("tail", "model-calls", "-n", "3", cwd=demo_dir)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 3
    assert {line["schema"] for line in lines} == {"ModelCall/v3"}
    first = lines[0]["record"]
    assert isinstance(first["completion_token_ids"], list) and all(
        isinstance(t, int) for t in first["completion_token_ids"]
    )
    assert len(first["completion_logprobs"]) == len(first["completion_token_ids"])


def test_tail_starts_at_an_offset_or_a_time(demo_dir: Path) -> None:
    everything = orchard("tail", "policy-versions", cwd=demo_dir).stdout.splitlines()
    assert len(everything) >= 1
    from_offset = orchard("tail", "policy-versions", "--from-offset", "1", cwd=demo_dir).stdout.splitlines()
    assert [json.loads(line)["offset"] for line in from_offset] == list(range(1, len(everything)))
    future = orchard("tail", "policy-versions", "--from-time", "2999-01-01T00:00:00", cwd=demo_dir)
    assert future.returncode == 0 and future.stdout == ""
    past = orchard("tail", "policy-versions", "--from-time", "-1d", cwd=demo_dir).stdout.splitlines()
    assert len(past) == len(everything)


def test_topics_create_makes_the_standard_topics_and_refuses_duplicates(tmp_path: Path) -> None:
    assert orchard("topics", "create", cwd=tmp_path).returncode == 0
    assert orchard("topics", "create", "extra", "--partitions", "3", cwd=tmp_path).returncode == 0
    again = orchard("topics", "create", "extra", cwd=tmp_path)
    assert again.returncode == 1
    assert "already exists" in again.stdout
    assert orchard("topics", "create", "extra", "--exist-ok", cwd=tmp_path).returncode == 0


def test_bad_config_fails_at_start_naming_the_field(tmp_path: Path) -> None:
    result = orchard("topics", "list", cwd=tmp_path, env={"ORCHARD_BUS__TYPE": "kafka"})
    assert result.returncode == 1
    assert "bus.kafka.bootstrap_servers" in result.stderr
    config = tmp_path / "orchard.yaml"
    config.write_text("bus:\n  type: embedded\n  segmnt_bytes: 10\n")
    result = orchard("--config", str(config), "topics", "list", cwd=tmp_path)
    assert result.returncode == 1
    assert "bus.embedded.segmnt_bytes" in result.stderr


def test_unreachable_kafka_is_one_clear_line(tmp_path: Path) -> None:
    env = {
        "ORCHARD_BUS__TYPE": "kafka",
        "ORCHARD_BUS__BOOTSTRAP_SERVERS": "127.0.0.1:9",
        "ORCHARD_BUS__CONNECT_TIMEOUT_S": "1",
    }
    result = orchard("topics", "list", cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert "no Kafka broker answered at 127.0.0.1:9 within 1s" in result.stderr
    assert "Traceback" not in result.stderr


def test_schemas_check_and_list(tmp_path: Path) -> None:
    check = orchard("schemas", "check", cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    assert "9 schemas" in check.stdout
    listing = orchard("schemas", "list", cwd=tmp_path)
    assert "ModelCall" in listing.stdout and "v1" in listing.stdout


def test_env_serve_refuses_to_start_without_its_secrets(tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    result = orchard("env", "serve", "--tasks", str(tmp_path / "tasks"), "--proxy", "http://127.0.0.1:9", cwd=tmp_path)
    assert result.returncode == 1
    assert "ORCHARD_ENV_TOKEN must be set" in result.stderr


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--runtime", "kubernetes"], "--runtime kubernetes needs --runtime-config FILE"),
        (["--runtime", "kubernetes", "--runtime-config", "{bad}"], "namespace"),
        (["--runtime", "podman"], "'podman' is neither local nor kubernetes"),
        (["--runtime-config", "{bad}"], "--runtime-config is for --runtime kubernetes"),
        (["--hide", "{missing}"], "--hide: no such path"),
    ],
)
def test_env_serve_names_the_bad_runtime_option(tmp_path: Path, options: list[str], message: str) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "bad.yaml").write_text("namespace: Not_A_Namespace\n")
    paths = {"{bad}": str(tmp_path / "bad.yaml"), "{missing}": str(tmp_path / "missing")}
    secrets = {"ORCHARD_ENV_TOKEN": "env-secret-0123456789", "ORCHARD_PROXY_ADMIN_TOKEN": "admin-secret-0123456789"}
    result = orchard(
        "env", "serve", "--tasks", str(tmp_path / "tasks"), "--proxy", "http://127.0.0.1:9",
        *[paths.get(word, word) for word in options], cwd=tmp_path, env=secrets,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert message in result.stderr


def test_engine_scripted_serves_a_plan_over_the_openai_api(tmp_path: Path) -> None:
    import socket
    import time

    import httpx

    plan = tmp_path / "plan.yaml"
    plan.write_text("model: scripted\nsteps:\n  - text: hello there\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")}
    server = subprocess.Popen([ORCHARD, "engine", "scripted", str(plan), "--port", str(port)], cwd=tmp_path, env=clean)
    try:
        deadline, reply = time.monotonic() + 30, None
        while reply is None and time.monotonic() < deadline:
            try:
                reply = httpx.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    json={"model": "scripted", "messages": [{"role": "user", "content": "hi"}]},
                )
            except httpx.TransportError:
                time.sleep(0.2)
        assert reply is not None and reply.status_code == 200
        body = reply.json()
        assert body["choices"][0]["message"]["content"] == "hello there"
        assert body["orchard"]["completion_token_ids"]
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_engine_serve_refuses_a_bad_device_naming_the_field(tmp_path: Path) -> None:
    done = orchard("engine", "serve", "--device", "gpu0", "--port", "1", cwd=tmp_path)
    assert done.returncode == 1
    assert "device: String should match pattern" in done.stderr


def test_eval_options_of_a_held_out_evaluation_without_tasks_are_refused_by_name(tmp_path: Path) -> None:
    result = orchard("eval", "--greedy-first", "--rerank", "4", cwd=tmp_path)
    assert result.returncode != 0
    said = " ".join((result.stdout + result.stderr).split())  # the console wraps long lines
    assert "--seed belong to a held-out evaluation: give --tasks" in said


def test_eval_refuses_a_greedy_margin_without_a_greedy_candidate_to_keep(tmp_path: Path) -> None:
    result = orchard("eval", "--tasks", ".", "--rerank", "4", "--greedy-margin", "0.1", cwd=tmp_path)
    assert result.returncode != 0
    said = " ".join((result.stdout + result.stderr).split())
    assert "give --greedy-first and --rerank K > 1" in said


def test_eval_refuses_to_wait_for_the_engine_without_a_held_out_evaluation(tmp_path: Path) -> None:
    result = orchard("eval", "--wait-for-engine", "http://127.0.0.1:9", "--plot", "--run-dir", ".", cwd=tmp_path)
    assert result.returncode != 0
    said = " ".join((result.stdout + result.stderr).split())
    assert "--wait-for-engine belongs to a held-out evaluation: give --tasks" in said


def test_eval_refuses_a_policy_version_without_an_engine_to_wait_for(tmp_path: Path) -> None:
    result = orchard("eval", "--tasks", ".", "--policy-version", "4", cwd=tmp_path)
    assert result.returncode != 0
    said = " ".join((result.stdout + result.stderr).split())
    assert "--policy-version names the version --wait-for-engine waits for" in said


def test_engine_expert_is_a_subcommand(tmp_path: Path) -> None:
    done = orchard("engine", "expert", "--help", cwd=tmp_path)
    assert done.returncode == 0 and "--tokenizer" in done.stdout and "--latency-s" in done.stdout
