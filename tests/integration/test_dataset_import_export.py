"""``orchard import`` / ``orchard export``: fixture files in every layout, dead letters, the round trip, memory.

Fixture files are written here in the shapes the README documents for each layout. Imports go through the real
bus (embedded, and Apache Kafka for the round trip) and are read back as ModelCall / EpisodeOutcome records.
"""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchard.bus import Bus, open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig, KafkaBusConfig
from orchard.datasets.conversation import ChatTokenizer
from orchard.datasets.exporter import ExportSelection, export_trajectories
from orchard.datasets.importer import DatasetImporter
from orchard.datasets.layouts import layout_with_overrides
from orchard.episode_recorder import EpisodeRecorder
from orchard.trajectory import Trajectory, trajectory_from_records

REPO = Path(__file__).resolve().parents[2]
TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"command": "pytest"}'}}
SWE_CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a software engineer."},
    {"role": "user", "content": "The parser drops the last line."},
    {"role": "assistant", "content": "Run the tests.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "FAILED tests/test_parse.py::test_empty"},
    {"role": "assistant", "content": "Fixed the loop; the tests pass."},
]


@dataclass(frozen=True)
class Topics:
    """The topics one test uses (unique names on the shared Kafka broker)."""

    model_calls: str = "model-calls"
    outcomes: str = "outcomes"
    dead_letters: str = "dead-letters"

    def create(self, bus: Bus) -> None:
        """Create all three, four partitions each."""
        for name in (self.model_calls, self.outcomes, self.dead_letters):
            bus.create_topic(name, 4, exist_ok=True)


@pytest.fixture(scope="module")
def chat() -> ChatTokenizer:
    return ChatTokenizer.load("tiny")


BusFactory = Callable[[], tuple[Bus, Topics]]


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def new_bus(request: pytest.FixtureRequest, tmp_path: Path, unique_name: Callable[[str], str]) -> Iterator[BusFactory]:
    """Opens a fresh bus (a new embedded log, or new topics on the real broker) each call."""
    opened: list[Bus] = []

    def make() -> tuple[Bus, Topics]:
        if request.param == "embedded":
            bus, topics = open_bus(EmbeddedBusConfig(path=tmp_path / f"bus{len(opened)}")), Topics()
        else:
            bus = open_bus(KafkaBusConfig(bootstrap_servers=request.getfixturevalue("kafka_bootstrap")))
            topics = Topics(unique_name("calls"), unique_name("outcomes"), unique_name("dead"))
        topics.create(bus)
        opened.append(bus)
        return bus, topics

    yield make
    for bus in opened:
        bus.close()


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Bus]:
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    Topics().create(bus)
    yield bus
    bus.close()


def read_all(bus: Bus, topic: str) -> list[dict[str, Any]]:
    """Every record of ``topic``, decoded, in (partition, offset) order."""
    expected, records = bus.describe_topic(topic).record_count, []
    consumer = bus.consumer([topic])
    try:
        deadline = time.monotonic() + 30
        while len(records) < expected and time.monotonic() < deadline:
            records += consumer.poll(500, 0.5)
    finally:
        consumer.close()
    codec = Codec.default()
    return [codec.decode(r.value).record for r in sorted(records, key=lambda r: (r.partition, r.offset))]


def trajectories(bus: Bus, topics: Topics = Topics()) -> dict[str, Trajectory]:  # noqa: B008 - frozen
    """Every episode on the bus, assembled, by episode id."""
    calls: dict[str, list[dict[str, Any]]] = {}
    for call in read_all(bus, topics.model_calls):
        calls.setdefault(call["episode_id"], []).append(call)
    outcomes = {o["episode_id"]: o for o in read_all(bus, topics.outcomes)}
    return {e: trajectory_from_records(calls.get(e, []), o) for e, o in outcomes.items()}


def import_file(bus: Bus, path: Path, layout: str, chat: ChatTokenizer | None, *maps: str, **kwargs: Any) -> Any:
    """Import ``path`` with ``layout`` into ``bus``; return the stats."""
    topics = kwargs.pop("topics", Topics())
    producer = bus.producer()
    try:
        importer = DatasetImporter(
            producer,
            layout_with_overrides(layout, list(maps)),
            tokenizer=chat,
            model_calls_topic=topics.model_calls,
            outcomes_topic=topics.outcomes,
            dead_letter_topic=topics.dead_letters,
            **kwargs,
        )
        return importer.import_files([path])
    finally:
        producer.close()


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def engine_prompt(chat: ChatTokenizer, messages: list[dict[str, Any]], tools: list[Any]) -> list[int]:
    """The prompt the engine would tokenize for ``messages`` (rendered whole, encoded whole)."""
    return chat.encode(chat.render(messages, tools, True))


# --- each layout imports to the expected records ---------------------------------------------------------------


def orchard_swe_file(tmp_path: Path) -> Path:
    """Parquet: messages as list<struct>, metadata as a JSON string, verify_status, tools as a JSON string."""
    rows = [
        {
            "messages": SWE_CHAT,
            "tools": json.dumps(TOOLS),
            "metadata": json.dumps({"instance_id": f"repo__{i}", "model": "teacher", "signals": {"f2p": i / 2}}),
            "verify_status": ["failed", "passed"][i],
        }
        for i in range(2)
    ]
    path = tmp_path / "orchard_swe.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def swe_smith_file(tmp_path: Path) -> Path:
    """Parquet: messages as a JSON string, instance_id, resolved, model, traj_id."""
    rows = [{"messages": json.dumps(SWE_CHAT), "instance_id": "r__1", "resolved": True, "model": "m", "traj_id": "tr1"}]
    path = tmp_path / "swe_smith.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def swe_gym_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "swe_gym.jsonl", [{"instance_id": "g__1", "messages": SWE_CHAT, "resolved": False}])


def gui_file(tmp_path: Path) -> Path:
    steps = [
        {"screenshot": "shots/0.png", "response": "click(3, 4)"},
        {"screenshot": "shots/1.png", "response": "stop"},
    ]
    row = {"task_id": "web-1", "trajectory_id": "gui-7", "instruction": "Open the page.", "steps": steps, "reward": 0.8}
    return write_jsonl(tmp_path / "gui.jsonl", [row])


def custom_file(tmp_path: Path) -> Path:
    row = {"id": "c-1", "conversations": SWE_CHAT, "label": "resolved", "meta": {"pass_rate": 0.75}}
    return write_jsonl(tmp_path / "custom.jsonl", [row])


GUI_MESSAGES = [
    {"role": "user", "content": "Open the page.\n[screenshot: shots/0.png]"},
    {"role": "assistant", "content": "click(3, 4)"},
    {"role": "user", "content": "[screenshot: shots/1.png]"},
    {"role": "assistant", "content": "stop"},
]
LAYOUT_CASES = {
    # layout: (file writer, --map, [(task_id, status, reward, signals, messages, tools)], episode id or None)
    "orchard-swe": (
        orchard_swe_file,
        [],
        [
            ("repo__0", "FAILED", 0.0, {"f2p": 0.0}, SWE_CHAT, TOOLS),
            ("repo__1", "SUCCEEDED", 1.0, {"f2p": 0.5}, SWE_CHAT, TOOLS),
        ],
        None,
    ),
    "orchard-gui": (gui_file, [], [("web-1", "SUCCEEDED", 0.8, {}, GUI_MESSAGES, [])], "gui-7"),
    "swe-gym": (swe_gym_file, [], [("g__1", "FAILED", 0.0, {}, SWE_CHAT, [])], None),
    "swe-smith": (swe_smith_file, [], [("r__1", "SUCCEEDED", 1.0, {}, SWE_CHAT, [])], "tr1"),
    "custom": (
        custom_file,
        ["conversations=messages", "label=success", "id=task_id", "meta.pass_rate=signal.pass_rate"],
        [("c-1", "SUCCEEDED", 1.0, {"pass_rate": 0.75}, SWE_CHAT, [])],
        None,
    ),
}


@pytest.mark.parametrize("layout", list(LAYOUT_CASES))
def test_each_layout_imports_to_retokenized_calls_and_labelled_outcomes(
    layout: str, tmp_path: Path, embedded: Bus, chat: ChatTokenizer
) -> None:
    writer, maps, expected, episode_id = LAYOUT_CASES[layout]
    stats = import_file(embedded, writer(tmp_path), layout, chat, *maps, run_id="sft", policy_version=0)
    assert (stats.rows, stats.episodes, stats.dead_lettered) == (len(expected), len(expected), 0)

    calls = read_all(embedded, "model-calls")
    assert {(c["retokenized"], c["completion_logprobs"], c["policy_version"], c["harness"]) for c in calls} == {
        (True, b"", 0, f"dataset:{layout}")
    }
    found = sorted(trajectories(embedded).values(), key=lambda t: t.task_id)
    summary = [(t.task_id, t.status, t.reward, dict(t.signals)) for t in found]
    assert summary == [case[:4] for case in expected]
    for trajectory, (*_, messages, tools) in zip(found, expected, strict=True):
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        assert [s.request_messages for s in trajectory.steps] == [messages[:i] for i in turns]
        assert [s.prompt_token_ids.tolist() for s in trajectory.steps] == [
            engine_prompt(chat, messages[:i], tools) for i in turns
        ]
        assert [s.response_text for s in trajectory.steps] == [messages[i]["content"] for i in turns]
        assert all(s.retokenized and len(s.completion_logprobs) == 0 for s in trajectory.steps)
        assert (trajectory.run_id, trajectory.group_id, trajectory.complete) == ("sft", trajectory.task_id, True)
        if episode_id is not None:
            assert trajectory.episode_id == episode_id
    outcomes = read_all(embedded, "outcomes")
    if layout == "orchard-gui":
        assert outcomes[0]["artifact_uris"] == ["shots/0.png", "shots/1.png"]


def test_malformed_rows_are_dead_lettered_with_file_row_and_reason_and_the_rest_imported(
    tmp_path: Path, embedded: Bus, chat: ChatTokenizer
) -> None:
    good = {"instance_id": "ok", "messages": SWE_CHAT, "resolved": True}
    path = write_jsonl(
        tmp_path / "mixed.jsonl",
        [
            good,
            "{not json",
            {"instance_id": "x", "messages": [{"role": "user", "content": "hi"}], "resolved": True},
            {"instance_id": "y", "messages": SWE_CHAT, "resolved": "maybe"},
            {**good, "instance_id": "ok2"},
        ],
    )
    stats = import_file(embedded, path, "swe-gym", chat, run_id="r")
    assert (stats.rows, stats.episodes, stats.dead_lettered) == (5, 2, 3)
    letters = read_all(embedded, "dead-letters")
    assert [(d["source_topic"], d["source_offset"], d["error_type"]) for d in letters] == [
        (f"file:{path}", 1, "MalformedRowError"),
        (f"file:{path}", 2, "MalformedMessagesError"),
        (f"file:{path}", 3, "InvalidLabelError"),
    ]
    assert letters[0]["reason"].startswith(f"{path} row 1: invalid JSON")
    assert letters[1]["reason"] == f"{path} row 2: messages: the conversation has no assistant message"
    assert letters[2]["reason"] == f"{path} row 3: resolved: cannot read 'maybe' as a success label"
    assert letters[0]["original"] == b"{not json\n"
    assert sorted(t.task_id for t in trajectories(embedded).values()) == ["ok", "ok2"]


def test_a_row_the_bus_refuses_midway_is_closed_cancelled_and_dead_lettered(
    tmp_path: Path, chat: ChatTokenizer
) -> None:
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "small", max_record_bytes=6_000))
    Topics().create(bus)
    long_chat = [*SWE_CHAT[:4], {"role": "tool", "tool_call_id": "c1", "content": "x " * 3_000}, SWE_CHAT[4]]
    path = write_jsonl(tmp_path / "long.jsonl", [{"instance_id": "big", "messages": long_chat, "resolved": True}])
    stats = import_file(bus, path, "swe-gym", chat, run_id="r")
    assert (stats.episodes, stats.dead_lettered, stats.reasons) == (0, 1, {"RecordTooLargeError": 1})
    [outcome] = read_all(bus, "outcomes")
    assert (outcome["status"], outcome["num_model_calls"]) == ("CANCELLED", 1)
    assert outcome["error"].startswith("import refused: record for topic 'model-calls' is ")
    bus.close()


def test_orchard_rows_that_break_the_layout_are_dead_lettered(tmp_path: Path, embedded: Bus) -> None:
    record_live_episodes(embedded, Topics(), "live", 3)
    export_trajectories(embedded, tmp_path / "out.jsonl", "jsonl")
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    rows[0]["status"] = "MAYBE"
    del rows[1]["calls"][0]["prompt_token_ids"]
    copy = open_bus(EmbeddedBusConfig(path=tmp_path / "copy"))
    Topics().create(copy)
    stats = import_file(copy, write_jsonl(tmp_path / "edited.jsonl", rows), "orchard", None, run_id=None)
    assert (stats.episodes, stats.dead_lettered) == (1, 2)
    reasons = [d["reason"].split(": ", 1)[1] for d in read_all(copy, "dead-letters")]
    assert sorted(reasons) == [
        "not an orchard-layout row: KeyError: 'prompt_token_ids'",
        "status: 'MAYBE' is not one of SUCCEEDED, FAILED, TIMED_OUT, CRASHED, CANCELLED",
    ]
    copy.close()


# --- export, and the round trip ---------------------------------------------------------------------------------


def record_live_episodes(bus: Bus, topics: Topics, run_id: str, count: int, start: int = 0) -> None:
    """Episodes as the proxy records them: sampled logprobs, a side conversation, tools that change."""
    producer = bus.producer()
    rng = np.random.default_rng(start)
    for n in range(start, start + count):
        recorder = EpisodeRecorder(
            producer, run_id=run_id, episode_id=f"{run_id}-ep{n}", task_id=f"task{n % 2}", harness="codex",
            model="policy", model_calls_topic=topics.model_calls, outcomes_topic=topics.outcomes,
        )  # fmt: skip
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {n}"}]
        prompt = rng.integers(0, 500, size=20)
        for index in range(3):
            completion = rng.integers(0, 500, size=5)
            reply = f"step {index}"
            tool_calls = [CALL] if index < 2 else []
            recorder.record_call(
                messages=messages, prompt_ids=prompt, completion_ids=completion,
                logprobs=rng.uniform(-3, 0, size=5).astype(np.float32), response_text=reply, tool_calls=tool_calls,
                tools=TOOLS if index else [], policy_version=7 + index,
                finish_reason="tool_calls" if tool_calls else "stop",
            )  # fmt: skip
            messages = [*messages, {"role": "assistant", "content": reply, "tool_calls": tool_calls}]
            messages.append({"role": "tool", "tool_call_id": "c1", "content": "ok"})
            prompt = np.concatenate([prompt, completion, rng.integers(0, 500, size=4)])
            if index == 1:  # a summariser subagent: another conversation in the same episode
                recorder.record_call(
                    messages=[{"role": "user", "content": "summarise", "weight": 0}], prompt_ids=[1, 2, 3],
                    completion_ids=[4], logprobs=[-0.25], response_text="short", policy_version=8, conversation_id=1,
                )  # fmt: skip
        recorder.record_outcome(
            status="SUCCEEDED" if n % 2 else "TIMED_OUT", reward=n / 10, group_id=f"g{n % 2}",
            signals={"tests": 0.5, "lint": 1.0}, policy_version=9, error=None,
        )  # fmt: skip
    producer.close()


def token_content(found: dict[str, Trajectory]) -> dict[tuple[str, int], Any]:
    """Each call's identity, tokens, logprobs, messages and response, by (episode, call index)."""
    return {
        (episode, s.call_index): (
            s.prompt_token_ids.tolist(),
            s.completion_token_ids.tolist(),
            s.completion_logprobs.tolist(),
            s.retokenized,
            s.policy_version,
            s.conversation_id,
            s.request_messages,
            s.response_text,
            s.response_tool_calls,
            s.finish_reason,
            t.status,
            t.reward,
            dict(t.signals),
        )  # fmt: skip
        for episode, t in found.items()
        for s in t.steps
    }


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_export_then_import_then_export_gives_identical_files_and_calls(
    fmt: str, new_bus: BusFactory, tmp_path: Path, chat: ChatTokenizer
) -> None:
    first, topics1 = new_bus()
    record_live_episodes(first, topics1, "live", 6)
    import_file(first, swe_gym_file(tmp_path), "swe-gym", chat, run_id="live", topics=topics1)
    selection = ExportSelection(run_id="live")
    out1, out2 = tmp_path / f"one.{fmt}", tmp_path / f"two.{fmt}"
    stats = export_trajectories(first, out1, fmt, selection, model_calls_topic=topics1.model_calls,  # type: ignore[arg-type]
                                outcomes_topic=topics1.outcomes)  # fmt: skip
    assert (stats.episodes, stats.calls, stats.incomplete, stats.skipped) == (7, 6 * 4 + 2, 0, 0)

    second, topics2 = new_bus()
    imported = import_file(second, out1, "orchard", None, run_id=None, topics=topics2)
    assert (imported.episodes, imported.dead_lettered) == (7, 0)
    export_trajectories(second, out2, fmt, selection, model_calls_topic=topics2.model_calls,  # type: ignore[arg-type]
                        outcomes_topic=topics2.outcomes)  # fmt: skip
    assert filecmp.cmp(out1, out2, shallow=False)
    assert token_content(trajectories(second, topics2)) == token_content(trajectories(first, topics1))


def test_the_exported_layout_loads_with_pandas_as_documented(
    tmp_path: Path, embedded: Bus, chat: ChatTokenizer
) -> None:
    record_live_episodes(embedded, Topics(), "live", 1)
    export_trajectories(embedded, tmp_path / "out.parquet", "parquet")
    export_trajectories(embedded, tmp_path / "out.jsonl", "jsonl")
    for frame in (pd.read_parquet(tmp_path / "out.parquet"), pd.read_json(tmp_path / "out.jsonl", lines=True)):
        row = frame.iloc[0]
        assert list(frame.columns) == [
            "run_id", "episode_id", "task_id", "group_id", "harness", "model", "messages", "tools_json", "input_ids",
            "loss_mask", "logprobs", "calls", "status", "reward", "success", "signals", "policy_version", "num_calls",
        ]  # fmt: skip
        assert (row.episode_id, row.status, row.success, row.num_calls) == ("live-ep0", "TIMED_OUT", False, 4)
        assert [m["role"] for m in row.messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
        assert len(row.input_ids) == len(row.loss_mask) == len(row.logprobs) == 20 + 3 * 5 + 2 * 4
        assert sum(row.loss_mask) == 15
        assert [s["name"] for s in row.signals] == ["lint", "tests"]
        assert [c["conversation_id"] for c in row.calls] == [0, 0, 1, 0]


def test_export_selects_episodes_by_run_time_and_offset(tmp_path: Path, embedded: Bus) -> None:
    record_live_episodes(embedded, Topics(), "a", 4)
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    record_live_episodes(embedded, Topics(), "b", 4, start=4)

    def episodes(**selection: Any) -> list[str]:
        out = tmp_path / "sel.jsonl"
        export_trajectories(embedded, out, "jsonl", ExportSelection(**selection))
        return sorted(json.loads(line)["episode_id"] for line in out.read_text().splitlines())

    assert episodes(run_id="a") == [f"a-ep{n}" for n in range(4)]
    assert episodes(from_ts=middle) == [f"b-ep{n}" for n in range(4, 8)]
    assert episodes(to_ts=middle) == [f"a-ep{n}" for n in range(4)]
    ends = embedded.describe_topic("outcomes").end_offsets
    assert len(episodes(to_offset=1)) == sum(1 for end in ends.values() if end)
    assert len(episodes(from_offset=1)) == 8 - sum(1 for end in ends.values() if end)


# --- the command line, and memory ----------------------------------------------------------------------------------


def orchard(*args: str, cwd: Path, bus: Path) -> subprocess.CompletedProcess[str]:
    """Run the installed ``orchard`` command on the embedded bus at ``bus``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")} | {
        "ORCHARD_BUS__TYPE": "embedded",
        "ORCHARD_BUS__PATH": str(bus),
    }
    command = [str(Path(sys.executable).with_name("orchard")), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)  # noqa: S603


def test_orchard_export_and_import_commands(tmp_path: Path) -> None:
    recorded = open_bus(EmbeddedBusConfig(path=tmp_path / "recorded"))
    Topics().create(recorded)
    record_live_episodes(recorded, Topics(), "live", 2)
    recorded.close()
    result = orchard("export", "--run", "live", "out.parquet", cwd=tmp_path, bus=tmp_path / "recorded")
    assert result.returncode == 0, result.stderr
    assert "exported 2 episodes (8 calls) to out.parquet" in result.stdout
    result = orchard("import", "out.parquet", "--layout", "orchard", cwd=tmp_path, bus=tmp_path / "copy")
    assert result.returncode == 0, result.stderr
    assert "imported 2 episodes (8 calls, " in result.stdout and "0 dead-lettered" in result.stdout
    result = orchard("import", "missing.jsonl", "--layout", "orchard", cwd=tmp_path, bus=tmp_path / "copy")
    assert (result.returncode, result.stderr.strip()) == (1, "error: missing.jsonl: no such file")


MEMORY_SCRIPT = """
import json, os, sys
from pathlib import Path
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from orchard.bus import open_bus
from orchard.config import EmbeddedBusConfig
from orchard.datasets.conversation import ChatTokenizer
from orchard.datasets.importer import DatasetImporter
from orchard.datasets.layouts import layout_with_overrides

work, rows = Path(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
words = "the parser drops the last line so we fix the loop and run the tests again".split()
texts = [" ".join(words[j] for j in rng.integers(0, len(words), 400)) for _ in range(16)]
schema = pa.schema([("messages", pa.string()), ("resolved", pa.bool_()), ("patch", pa.binary())])
with pq.ParquetWriter(work / "big.parquet", schema) as writer:
    for start in range(0, rows, 50):
        batch = []
        for i in range(start, start + 50):
            text = texts[i % 16] + f" row {i}"
            chat = [{"role": "user", "content": text}, {"role": "assistant", "content": text[:600]},
                    {"role": "user", "content": text[600:]}, {"role": "assistant", "content": "done"}]
            batch.append({"messages": json.dumps(chat), "resolved": bool(i % 2), "patch": rng.bytes(100_000)})
        writer.write_table(pa.Table.from_pylist(batch, schema=schema))
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * page
bus = open_bus(EmbeddedBusConfig(path=work / "bus", fsync="never"))
for name in ("model-calls", "outcomes", "dead-letters"):
    bus.create_topic(name, 4)
importer = DatasetImporter(bus.producer(), layout_with_overrides("swe-gym"),
                           run_id="mem", tokenizer=ChatTokenizer.load("tiny"))
samples = []
def sample():
    if importer.stats.rows % 20 == 0:
        samples.append(rss())
importer.import_files([work / "big.parquet"], on_row=sample)
warm = max(samples[: len(samples) // 5])
print(json.dumps({"rows": importer.stats.episodes, "file": (work / "big.parquet").stat().st_size,
                  "warm": warm, "peak": max(samples)}))
"""


def test_memory_stays_bounded_while_importing_a_large_file(tmp_path: Path) -> None:
    rows = 500
    result = subprocess.run(  # noqa: S603 - our own interpreter and script
        [sys.executable, "-c", MEMORY_SCRIPT, str(tmp_path), str(rows)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["rows"] == rows
    assert figures["file"] > 45 * 2**20  # the file is far larger than the growth allowed below
    growth = figures["peak"] - figures["warm"]
    assert growth < 16 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB after warm-up over {rows} rows"


def test_an_imported_orchard_swe_dataset_becomes_sft_samples_through_the_consumers(
    tmp_path: Path, embedded: Bus, chat: ChatTokenizer
) -> None:
    from consumers.assembler import TrajectoryAssembler
    from consumers.config import RuntimeConfig
    from consumers.runtime import ConsumerRuntime
    from consumers.samples import SampleBuilder, SampleBuilderConfig
    from orchard.tokens import unpack_array

    import_file(embedded, orchard_swe_file(tmp_path), "orchard-swe", chat, run_id="sft", policy_version=0)
    imported = trajectories(embedded)
    builder = SampleBuilder(SampleBuilderConfig(kinds=["SFT"], group_size=1, sft_successful_only=True))
    for processor in (TrajectoryAssembler(), builder):
        ConsumerRuntime(embedded, processor, instance_id="import-test",
                        config=RuntimeConfig(poll_timeout_s=0.1)).run(idle_exit_s=1.5)  # fmt: skip

    [sample] = read_all(embedded, "samples")  # the successful demonstration only
    [source] = [t for t in imported.values() if t.success]
    assert (sample["kind"], sample["episode_id"], sample["task_id"]) == ("SFT", source.episode_id, "repo__1")
    last = source.steps[-1]
    assert unpack_array(sample["token_ids"], "int32").tolist() == last.sequence.tolist()
    mask = unpack_array(sample["loss_mask"], "uint8")
    assert int(mask.sum()) == sum(len(step.completion_token_ids) for step in source.steps)  # the assistant's tokens
    weights = unpack_array(sample["advantages"], "float32")
    assert set(weights[mask == 1].tolist()) == {1.0} and not weights[mask == 0].any()
    # re-tokenized text has no sampling logprobs: nothing downstream may take it for on-policy data
    assert sample["behaviour_logprobs"] == b""
