"""The backbone demo: a scripted 30-call episode through the bus and a weight version through the store, read back.

It exercises what every later component relies on, on whatever bus and store the config names: standard topics,
prefix-delta ``ModelCall`` records keyed by episode, an ``EpisodeOutcome``, a policy version published manifest
last with its ``PolicyVersion`` record, then a replay that rebuilds every prompt and message token-exactly and a
download that verifies every sha256.
"""

from __future__ import annotations

import hashlib
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress

from orchard.artifacts import policy_artifact_name
from orchard.bus import Bus, TopicPartition, open_bus, read_until_quiet
from orchard.codec import Codec
from orchard.config import OrchardConfig
from orchard.episode_recorder import EpisodeRecorder
from orchard.prefix_delta import PromptReconstructor
from orchard.store import open_store
from orchard.topics import MODEL_CALLS, OUTCOMES, STANDARD_TOPICS
from trainers.weights import publish_policy_version

DEMO_MODEL = "tiny-demo"


@dataclass
class DemoReport:
    """What the demo published and verified."""

    episode_id: str
    calls: int
    bytes_on_bus: int
    prompt_tokens_total: int
    prompts_rebuilt: int
    outcome_status: str
    policy_version: int
    weights_verified: bool


@dataclass
class ScriptedCall:
    """One call of the scripted agent, as the proxy would see it."""

    messages: list[dict[str, Any]]
    prompt: np.ndarray
    completion: np.ndarray
    reply: str


def scripted_episode(calls: int, seed: int = 0) -> list[ScriptedCall]:
    """A multi-turn agent: each call's context is the previous one plus the reply and a tool result."""
    rng = np.random.default_rng(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You fix bugs. Use the shell tool."},
        {"role": "user", "content": "tests/test_parse.py::test_empty fails with IndexError."},
    ]
    prompt = rng.integers(0, 32_000, 300)
    script = []
    for k in range(calls):
        completion = rng.integers(0, 32_000, int(rng.integers(20, 80)))
        reply = f"step {k}: running `pytest -x` to check the fix"
        script.append(ScriptedCall(list(messages), prompt, completion, reply))
        tool_output = rng.integers(0, 32_000, int(rng.integers(30, 120)))
        messages = [
            *messages,
            {"role": "assistant", "content": reply},
            {"role": "tool", "content": f"exit code {k % 2}: {'.' * (k + 1)}"},
        ]
        prompt = np.concatenate([prompt, completion, tool_output])
    return script


def run_demo(config: OrchardConfig, calls: int = 30, console: Console | None = None) -> DemoReport:
    """Publish, replay and verify; raise on any mismatch."""
    console = console or Console()
    bus, store, codec = open_bus(config.bus), open_store(config.store), Codec.default()
    try:
        for spec in STANDARD_TOPICS:
            bus.create_topic(spec.name, spec.partitions, spec.config, exist_ok=True)
        starts = {topic: bus.describe_topic(topic).end_offsets for topic in (MODEL_CALLS, OUTCOMES)}
        episode_id = f"demo-{uuid.uuid4().hex[:10]}"
        script = scripted_episode(calls)
        producer = bus.producer()
        recorder = EpisodeRecorder(
            producer,
            run_id=config.run_id,
            episode_id=episode_id,
            task_id="demo-task",
            harness="scripted",
            model=DEMO_MODEL,
        )
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("recording model calls", total=calls)
            for call in script:
                logprobs = -np.abs(np.random.default_rng(len(call.prompt)).normal(size=len(call.completion)))
                recorder.record_call(
                    messages=call.messages,
                    prompt_ids=call.prompt,
                    completion_ids=call.completion,
                    logprobs=logprobs,
                    response_text=call.reply,
                    policy_version=0,
                )
                progress.advance(task)
        recorder.record_outcome(
            status="SUCCEEDED", reward=1.0, group_id="demo-group", signals={"ran_tests": 1.0, "fixed": 1.0}
        )
        producer.flush()
        version = _publish_weights(config, store, producer)
        rebuilt, status = _replay(bus, codec, episode_id, starts, script)
        verified = _verify_download(store, config.run_id, version)
        return DemoReport(
            episode_id=episode_id,
            calls=calls,
            bytes_on_bus=recorder.bytes_published,
            prompt_tokens_total=sum(len(c.prompt) for c in script),
            prompts_rebuilt=rebuilt,
            outcome_status=status,
            policy_version=version,
            weights_verified=verified,
        )
    finally:
        bus.close()
        store.close()


def _publish_weights(config: OrchardConfig, store: Any, producer: Any) -> int:
    version = (store.latest_version(policy_artifact_name(config.run_id, DEMO_MODEL)) or 0) + 1
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / "weights.bin"
        weights.write_bytes(np.random.default_rng(version).standard_normal(1 << 20).astype(np.float32).tobytes())
        publish_policy_version(
            store, producer, run_id=config.run_id, model=DEMO_MODEL, version=version,
            files={"weights.bin": weights}, trainer_step=version * 100, metrics={"loss": 1.0 / version},
        )  # fmt: skip
    return version


def _verify_download(store: Any, run_id: str, version: int) -> bool:
    """Download the version and hash every file ourselves against the manifest."""
    with tempfile.TemporaryDirectory() as tmp:
        manifest = store.download_version(policy_artifact_name(run_id, DEMO_MODEL), version, Path(tmp), verify=True)
        return all(
            hashlib.sha256((Path(tmp) / entry.path).read_bytes()).hexdigest() == entry.sha256
            for entry in manifest.files
        )


def _replay(
    bus: Bus, codec: Codec, episode_id: str, starts: dict[str, dict[int, int]], script: list[ScriptedCall]
) -> tuple[int, str]:
    """Read the episode back from where the demo started writing; rebuild and compare every prompt."""
    reconstructor = PromptReconstructor()
    status = "missing"
    for topic in (MODEL_CALLS, OUTCOMES):
        ends = bus.describe_topic(topic).end_offsets
        reader = bus.consumer([topic])
        for partition, offset in starts[topic].items():
            reader.seek(TopicPartition(topic, partition), offset)
        until = {TopicPartition(topic, p): end for p, end in ends.items() if end > starts[topic][p]}
        for record in read_until_quiet(reader, max_records=500, poll_timeout_s=2.0, idle_polls=1, until=until):
            decoded = codec.decode(record.value).record
            if decoded["episode_id"] != episode_id:
                continue
            if topic == MODEL_CALLS:
                k = decoded["call_index"]
                prompt = reconstructor.add_model_call(decoded)
                if not np.array_equal(prompt, script[k].prompt) or reconstructor.messages(k) != script[k].messages:
                    raise AssertionError(f"call {k} did not rebuild exactly")
            else:
                status = decoded["status"]
        reader.close()
    rebuilt = sum(1 for k in range(len(script)) if k in reconstructor)
    if rebuilt != len(script):
        raise AssertionError(f"only {rebuilt} of {len(script)} calls came back")
    return rebuilt, status
