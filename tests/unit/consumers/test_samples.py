"""The sample builder: sequences and loss masks, group-relative advantages, dense scores, credit weights, stable
sample ids, and a restart over the same state store giving exactly the same output (an in-memory driver)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from consumers.credit import CreditConfig
from consumers.processor import Input, RecordRejected
from consumers.sample_state import PreparedTrajectory
from consumers.samples import SampleBuilder, SampleBuilderConfig
from consumers.sequences import CallSpan, build_sequences
from orchard.codec import Codec
from orchard.episode_recorder import EpisodeRecorder
from orchard.tokens import unpack_array
from orchard.trajectory import Step
from orchard.trajectory_records import trajectory_from_record, trajectory_record

CODEC = Codec.default()


# ----------------------------------------------------------------------------------------------- the driver
class DictStore:
    """A plain dict as the ``StateStore`` (pure-logic tests only)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def put(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def delete(self, key: str) -> None:
        self.data.pop(key, None)

    def items(self) -> Iterator[tuple[str, bytes]]:
        return iter(list(self.data.items()))

    def home(self, key: str) -> int | None:
        return None

    def at_partition(self, partition: int | None) -> AbstractContextManager[None]:
        return nullcontext()


def drive(
    config: SampleBuilderConfig,
    inputs: Sequence[Input | int],
    *,
    restart_after: Sequence[int] = (),
    store: DictStore | None = None,
) -> tuple[list[dict[str, Any]], SampleBuilder]:
    """Feed ``inputs`` (an int is a ``punctuate(now)``) to a builder; a fresh builder over the same store takes
    over after each position in ``restart_after``. Every output must encode as a valid TrainingSample."""
    store = store if store is not None else DictStore()
    out: list[dict[str, Any]] = []

    def emit(topic: str, schema: str, record: Mapping[str, Any], key: str | bytes | None = None) -> None:
        assert (topic, schema, key) == ("samples", "TrainingSample", record["episode_id"])
        CODEC.encode(schema, record)
        out.append(dict(record))

    builder = SampleBuilder(config)
    builder.open(store)
    for position, item in enumerate(inputs):
        if isinstance(item, int):
            builder.punctuate(item, emit)
        else:
            builder.process(item, emit)
        if position in restart_after:
            builder = SampleBuilder(config)
            builder.open(store)
    return out, builder


class _Collect:
    def __init__(self) -> None:
        self.records: list[tuple[str, bytes]] = []

    def produce(self, topic: str, value: bytes, key: bytes | None = None, on_delivery: Any = None) -> None:
        self.records.append((topic, value))


def shell(index: int, command: str) -> dict[str, Any]:
    arguments = json.dumps({"command": command})
    return {"id": f"call_{index}", "type": "function", "function": {"name": "shell", "arguments": arguments}}


def episode(
    episode_id: str,
    *,
    reward: float,
    status: str = "FAILED",
    group: str = "g1",
    timestamp: int = 1000,
    first_command: str = "pytest -q",
    first_result: str = '{"exit_code": 1, "output": "FAILED test_x"}',
    signals: dict[str, float] | None = None,
    complete: bool = True,
    offset: int = 0,
) -> Input:
    """A decoded ``Trajectory`` record of a two-call episode, built the way the recorder and assembler build it.

    Call 0: prompt [1, 2, 3], completion [10, 11] (a shell tool call); call 1: prompt = call 0's sequence + [7, 8]
    (the tool result), completion [20, 21, 22]. Logprobs are -0.1 * (position in the completion + 1).
    """
    producer = _Collect()
    recorder = EpisodeRecorder(
        producer,
        run_id="run",
        episode_id=episode_id,
        task_id="task",
        harness="builtin",
        model="m",  # type: ignore[arg-type]
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "fix the bug"}]
    call = shell(0, first_command)
    recorder.record_call(messages=messages, prompt_ids=[1, 2, 3], completion_ids=[10, 11], logprobs=[-0.1, -0.2],
                         response_text="", tool_calls=[call], policy_version=5, finish_reason="tool_calls")  # fmt: skip
    messages = [*messages, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_0", "content": first_result}]  # fmt: skip
    submit = {"id": "call_1", "type": "function", "function": {"name": "submit", "arguments": "{}"}}
    recorder.record_call(messages=messages, prompt_ids=TOKENS[:7], completion_ids=[20, 21, 22], policy_version=6,
                         logprobs=[-0.1, -0.2, -0.3], response_text="", tool_calls=[submit])  # fmt: skip
    recorder.record_outcome(status=status, reward=reward, group_id=group, signals=signals or {})  # type: ignore[arg-type]
    calls = [value for topic, value in producer.records if topic == "model-calls"]
    [outcome] = [value for topic, value in producer.records if topic == "outcomes"]
    record = trajectory_record(
        run_id="run", episode_id=episode_id, task_id="task", calls=calls, outcome=outcome if complete else None,
        outcome_fields=CODEC.decode(outcome).record if complete else None, policy_version=6, timestamp_ms=timestamp,
        incomplete_reason=None if complete else "no outcome within 600 s",
    )  # fmt: skip
    decoded = CODEC.decode(CODEC.encode("Trajectory", record)).record
    return Input("trajectories", "Trajectory", decoded, episode_id.encode(), timestamp, 0, offset)


def score(
    episode_id: str,
    scorer: str,
    call_index: int,
    value: float,
    timestamp: int,
    span: tuple[int, int] | None = None,
    *,
    count: int | None = None,
    version: int | None = None,
) -> Input:
    """A decoded ``StepScore``; ``count`` is its ``episode_score_count``; ``version`` 1 writes it as StepScore v1."""
    record = {
        "run_id": "run", "episode_id": episode_id, "call_index": call_index, "scorer": scorer, "policy_version": 5,
        "token_start": span[0] if span else None, "token_end": span[1] if span else None, "score": value,
        "details_json": "{}", "timestamp": timestamp,
    }  # fmt: skip
    if count is not None:
        record["episode_score_count"] = count
    writer = Codec(CODEC.catalog, versions={"StepScore": version}) if version else CODEC
    decoded = CODEC.decode(writer.encode("StepScore", record)).record
    return Input("scores", "StepScore", decoded, episode_id.encode(), timestamp, 0, 0)


def arrays(sample: Mapping[str, Any]) -> tuple[list[int], list[int], list[float], list[float]]:
    """Token ids, loss mask, advantages (rounded) and behaviour logprobs (rounded) of a sample."""
    tokens = unpack_array(sample["token_ids"], "int32").tolist()
    mask = unpack_array(sample["loss_mask"], "uint8").tolist()
    values = [round(v, 4) for v in unpack_array(sample["advantages"], "float32").tolist()]
    logprobs = [round(v, 4) for v in unpack_array(sample["behaviour_logprobs"], "float32").tolist()]
    return tokens, mask, values, logprobs


TOKENS = [1, 2, 3, 10, 11, 7, 8, 20, 21, 22]
MASK = [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]


# ----------------------------------------------------------------------------------------------- sequences
def _step(index: int, conversation: int, prompt: list[int], completion: list[int], retokenized: bool = False) -> Step:
    return Step(
        call_index=index, conversation_id=conversation, policy_version=10 + index,
        prompt_token_ids=np.array(prompt, dtype=np.int32), completion_token_ids=np.array(completion, dtype=np.int32),
        completion_logprobs=-np.arange(1, len(completion) + 1, dtype=np.float32), request_messages=[],
        response_text="", response_tool_calls=[], finish_reason="stop", retokenized=retokenized,
    )  # fmt: skip


def test_calls_that_extend_each_other_become_one_sequence_masking_only_generated_tokens() -> None:
    steps = [
        _step(0, 0, [1, 2], [3, 4]),
        _step(1, 1, [9], [8]),  # a sub-agent: its own conversation
        _step(2, 0, [1, 2, 3, 4, 5], [6]),  # extends call 0 (5 is the tool result)
        _step(3, 0, [1, 2, 7], [4, 4]),  # a compacted context: does not extend, starts a new sequence
    ]
    first, subagent, compacted = build_sequences(steps)
    assert first.token_ids.tolist() == [1, 2, 3, 4, 5, 6]
    assert first.completion_mask().tolist() == [0, 0, 1, 1, 0, 1]
    assert first.logprobs.tolist() == [0, 0, -1, -2, 0, -1]
    assert first.spans == (CallSpan(0, 2, 4, 10), CallSpan(2, 5, 6, 12))
    assert (first.first_call, first.last_call, first.oldest_policy_version) == (0, 2, 10)
    assert (subagent.token_ids.tolist(), subagent.completion_mask().tolist()) == ([9, 8], [0, 1])
    assert (compacted.token_ids.tolist(), compacted.completion_mask().tolist()) == ([1, 2, 7, 4, 4], [0, 0, 0, 1, 1])
    assert compacted.spans == (CallSpan(3, 3, 5, 13),)


def test_retokenized_calls_can_be_left_out_of_the_mask() -> None:
    [sequence] = build_sequences([_step(0, 0, [1], [2, 3], retokenized=True), _step(1, 0, [1, 2, 3, 4], [5])])
    assert sequence.completion_mask().tolist() == [0, 1, 1, 0, 1]
    assert sequence.completion_mask(include_retokenized=False).tolist() == [0, 0, 0, 0, 1]


# ----------------------------------------------------------------------------------------------- RL samples
def test_group_relative_advantages_apply_to_exactly_the_completion_tokens() -> None:
    config = SampleBuilderConfig(group_size=4)
    inputs = [episode(f"e{i}", reward=r, timestamp=1000 + i) for i, r in enumerate([1.0, 0.0, 0.0, 1.0])]
    out, builder = drive(config, inputs)
    assert [s["episode_id"] for s in out] == ["e0", "e1", "e2", "e3"]
    for sample, expected in zip(out, [1.0, -1.0, -1.0, 1.0], strict=True):
        tokens, mask, values, logprobs = arrays(sample)
        assert (tokens, mask) == (TOKENS, MASK)
        assert values == [round(expected * m, 4) for m in MASK]  # (r - 0.5) / (0.5 + eps), 0 where masked
        assert logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.1, -0.2, -0.3]
    first = out[0]
    assert (first["kind"], first["policy_version"], first["reward"], first["group_id"]) == ("RL", 5, 1.0, "g1")
    assert first["created_at"] == 1003  # the close time: the last member's arrival (event time)
    assert builder.stats["groups"] == 1


def test_the_sample_std_of_trls_grpo_is_a_setting() -> None:
    config = SampleBuilderConfig(group_size=4, advantage_ddof=1, advantage_eps=1e-4)
    inputs = [episode(f"e{i}", reward=r, timestamp=1000 + i) for i, r in enumerate([1.0, 0.0, 0.0, 1.0])]
    out, _ = drive(config, inputs)
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # (r - mean) / (sample std + eps)
    assert [arrays(s)[2][-1] for s in out] == [round(x, 4) for x in (expected, -expected, -expected, expected)]
    with pytest.raises(ValidationError):
        SampleBuilderConfig(advantage_ddof=2)


def test_a_group_with_equal_rewards_carries_no_outcome_signal() -> None:
    inputs = [episode(f"e{i}", reward=0.5, timestamp=1000 + i) for i in range(2)]
    out, builder = drive(SampleBuilderConfig(group_size=2), inputs)
    assert out == [] and builder.stats["RL_zero_signal"] == 2
    out, _ = drive(SampleBuilderConfig(group_size=2, emit_zero_samples=True), inputs)
    assert [arrays(s)[2] for s in out] == [[0.0] * 10] * 2


def test_dense_scores_are_weighted_and_span_scores_apply_to_their_span() -> None:
    config = SampleBuilderConfig(group_size=2, scorers={"prm": 0.5, "kl": 2.0}, score_wait_ms=500, score_settle_ms=50)
    inputs: list[Input | int] = [
        score("e0", "prm", 0, 1.0, 900),  # scores may arrive before their trajectory
        episode("e0", reward=1.0, timestamp=1000),
        score("e0", "kl", 1, -0.1, 1001, span=(1, 3)),  # tokens 1..2 of call 1's completion
        score("e0", "kl", 0, float("nan"), 1001),  # an abstention
        episode("e1", reward=0.0, timestamp=1002),
        score("e1", "prm", 1, -1.0, 1003),
        score("e1", "kl", 0, 0.25, 1003),
        score("e1", "other", 0, 100.0, 1003),  # a scorer the config does not weigh
        1053,  # e1's scorers have settled
    ]
    out, _ = drive(config, inputs)
    e0, e1 = (arrays(sample)[2] for sample in out)
    a = 0.999998  # (1 - 0.5) / (0.5 + 1e-6)
    assert e0 == [round(v, 4) for v in [0, 0, 0, a + 0.5, a + 0.5, 0, 0, a, a - 0.2, a - 0.2]]
    assert e1 == [round(v, 4) for v in [0, 0, 0, -a + 0.5, -a + 0.5, 0, 0, -a - 0.5, -a - 0.5, -a - 0.5]]


@pytest.mark.parametrize("baseline", ["none", "call_index"])
def test_with_a_call_index_baseline_siblings_that_did_the_same_get_no_dense_signal_and_a_better_call_gets_a_positive(
    baseline: str,
) -> None:
    config = SampleBuilderConfig(group_size=3, scorers={"steps": 0.5}, score_wait_ms=500, score_settle_ms=50,
                                 dense_baseline=baseline)  # fmt: skip
    inputs: list[Input | int] = []
    for index, first in enumerate([0.5, 0.5, -0.1]):  # all succeeded; e2's first call was a detour
        name = f"e{index}"
        inputs += [
            episode(name, reward=1.0, status="SUCCEEDED", timestamp=1000 + index),
            score(name, "steps", 0, first, 1000 + index),
            score(name, "steps", 1, 0.5, 1000 + index),
        ]
    inputs.append(1060)
    out, _ = drive(config, inputs)
    values = {sample["episode_id"]: arrays(sample)[2] for sample in out}
    if baseline == "none":  # every member's tokens pushed up, the detour's first call a little down
        assert values["e0"] == values["e1"] == [0, 0, 0, 0.25, 0.25, 0, 0, 0.25, 0.25, 0.25]
        assert values["e2"] == [0, 0, 0, -0.05, -0.05, 0, 0, 0.25, 0.25, 0.25]
    else:  # call 0: 0.5 - mean(0.5, -0.1) = 0.3 for e0 and e1, -0.1 - 0.5 = -0.6 for e2; call 1 the same for all
        assert values["e0"] == values["e1"] == [0, 0, 0, 0.15, 0.15, 0, 0, 0, 0, 0]
        assert values["e2"] == [0, 0, 0, -0.3, -0.3, 0, 0, 0, 0, 0]


def test_a_call_index_baseline_leaves_a_group_whose_members_all_did_the_same_with_no_sample() -> None:
    config = SampleBuilderConfig(group_size=2, scorers={"steps": 0.5}, score_wait_ms=500, score_settle_ms=50,
                                 dense_baseline="call_index")  # fmt: skip
    inputs: list[Input | int] = []
    for name in ("e0", "e1"):
        inputs += [episode(name, reward=1.0, status="SUCCEEDED"), score(name, "steps", 0, 0.5, 1000),
                   score(name, "steps", 1, 0.0, 1000)]  # fmt: skip
    out, _ = drive(config, [*inputs, 1060])
    assert out == []  # every advantage 0: nothing to learn, so no noise-only step


@pytest.mark.parametrize(("size", "value"), [(8, -0.1), (3, 0.1), (5, 0.3), (7, -0.2), (1, 0.5)])
def test_a_call_index_baseline_gives_identical_members_and_a_group_of_one_exactly_no_dense_signal(
    size: int, value: float
) -> None:
    config = SampleBuilderConfig(group_size=size, scorers={"steps": 0.5}, score_wait_ms=500, score_settle_ms=50,
                                 dense_baseline="call_index")  # fmt: skip
    inputs: list[Input | int] = []
    for index in range(size):  # (sum - own) / (n - 1) leaves residues like -1.4e-17 for these values
        name = f"e{index}"
        inputs += [episode(name, reward=1.0, status="SUCCEEDED"), score(name, "steps", 0, value, 1000),
                   score(name, "steps", 1, value, 1000)]  # fmt: skip
    out, _ = drive(config, [*inputs, 1060])
    assert out == []


def test_a_scorer_without_a_count_counts_as_done_once_the_settle_time_passed_after_its_first_score() -> None:
    config = SampleBuilderConfig(group_size=1, scorers={"prm": 1.0}, score_settle_ms=100, emit_zero_samples=True)
    for version in (1, 2):  # a StepScore v1 record, and a v2 record whose scorer does not say how many it sent
        one_by_one = [episode("e0", reward=0.0, timestamp=1000), score("e0", "prm", 0, 1.0, 1010, version=version)]
        late = score("e0", "prm", 1, 1.0, 1050, version=version)  # the same scorer's next record (the next poll)
        out, _ = drive(config, [*one_by_one, late, 1109])
        assert out == []
        out, _ = drive(config, [*one_by_one, late, 1110])
        assert [(s["created_at"], arrays(s)[2]) for s in out] == [(1110, [0, 0, 0, 1, 1, 0, 0, 1, 1, 1])]
    scores_first = [score("e0", "prm", 0, 1.0, 900), episode("e0", reward=0.0, timestamp=950), 999]
    assert [s["created_at"] for s in drive(config, [*scores_first, 1000])[0]] == [1000]


def test_the_builder_emits_the_moment_a_scorers_announced_count_has_come_without_waiting_to_settle() -> None:
    config = SampleBuilderConfig(group_size=1, scorers={"prm": 1.0}, score_settle_ms=60_000, emit_zero_samples=True)
    first = [episode("e0", reward=0.0, timestamp=1000), score("e0", "prm", 0, 1.0, 1010, count=2)]
    out, _ = drive(config, first)
    assert out == []
    out, _ = drive(config, [*first, score("e0", "prm", 1, 1.0, 1050, count=2)])
    assert [(s["created_at"], arrays(s)[2]) for s in out] == [(1050, [0, 0, 0, 1, 1, 0, 0, 1, 1, 1])]
    before = [score("e0", "prm", 1, 1.0, 900, count=2), score("e0", "prm", 0, 1.0, 901, count=2)]
    out, _ = drive(config, [*before, episode("e0", reward=0.0, timestamp=950)])  # all came before the trajectory
    assert [s["created_at"] for s in out] == [950]


def test_a_scorer_that_announced_a_count_is_waited_for_past_the_settle_time_until_the_score_deadline() -> None:
    config = SampleBuilderConfig(
        group_size=1, scorers={"prm": 1.0}, score_settle_ms=100, score_wait_ms=5_000, emit_zero_samples=True
    )
    inputs = [episode("e0", reward=0.0, timestamp=1000), score("e0", "prm", 0, 1.0, 1010, count=3)]
    out, _ = drive(config, [*inputs, score("e0", "prm", 1, 1.0, 1020, count=3), 5_999])
    assert out == []
    out, builder = drive(config, [*inputs, score("e0", "prm", 1, 1.0, 1020, count=3), 6_000])
    assert [(s["created_at"], arrays(s)[2]) for s in out] == [(6_000, [0, 0, 0, 1, 1, 0, 0, 1, 1, 1])]
    assert builder.stats["score_wait_timeouts"] == 1


def test_a_restart_between_a_scorers_records_still_emits_when_its_count_comes() -> None:
    config = SampleBuilderConfig(group_size=1, scorers={"prm": 1.0}, score_settle_ms=60_000, emit_zero_samples=True)
    inputs = [
        episode("e0", reward=0.0, timestamp=1000),
        score("e0", "prm", 0, 1.0, 1010, count=2),
        score("e0", "prm", 1, 1.0, 1050, count=2),
    ]
    out, _ = drive(config, inputs, restart_after=[1])
    assert [(s["created_at"], arrays(s)[2]) for s in out] == [(1050, [0, 0, 0, 1, 1, 0, 0, 1, 1, 1])]


def test_a_trajectory_waits_for_its_scorers_only_until_the_score_deadline() -> None:
    config = SampleBuilderConfig(group_size=1, scorers={"prm": 1.0}, score_wait_ms=500, emit_zero_samples=True)
    out, builder = drive(config, [episode("e0", reward=1.0, timestamp=1000), 1499])
    assert out == []
    out, builder = drive(config, [episode("e0", reward=1.0, timestamp=1000), 1500])
    assert len(out) == 1 and out[0]["created_at"] == 1500 and builder.stats["score_wait_timeouts"] == 1


def test_a_group_that_never_fills_closes_on_its_timeout() -> None:
    config = SampleBuilderConfig(group_size=4, group_timeout_ms=5000)
    inputs = [episode("e0", reward=1.0, timestamp=1000), episode("e1", reward=0.0, timestamp=2000), 5999]
    out, _ = drive(config, inputs)
    assert out == []
    out, _ = drive(config, [*inputs, 6000])
    assert [(s["episode_id"], s["created_at"]) for s in out] == [("e0", 6000), ("e1", 6000)]


def test_a_group_closes_full_when_its_last_episode_arrives_even_if_one_was_not_trained_on() -> None:
    """A crashed episode and one without an outcome's calls are no samples, but still members of their group: the
    group closes when the last episode started with it arrives, not on its timeout (lockstep rounds wait for that)."""
    config = SampleBuilderConfig(group_size=3, group_timeout_ms=30_000)
    inputs = [episode("e0", reward=1.0, timestamp=1000),
              episode("crashed", reward=0.0, status="CRASHED", timestamp=1001),
              episode("e1", reward=0.0, timestamp=1002)]  # fmt: skip
    out, builder = drive(config, inputs)
    assert sorted({s["episode_id"] for s in out}) == ["e0", "e1"] and {s["created_at"] for s in out} == {1002}
    assert (builder.stats["status_CRASHED"], builder.stats["groups"]) == (1, 1)
    out, builder = drive(config, [episode("c0", reward=0.0, status="CRASHED", timestamp=1000),
                                  episode("c1", reward=0.0, status="CRASHED", timestamp=1001),
                                  episode("c2", reward=0.0, status="CRASHED", timestamp=1002)])  # fmt: skip
    assert out == [] and builder.stats["groups_without_trainable_members"] == 1
    assert list(builder._groups.open_groups()) == []


# ----------------------------------------------------------------------------------------------- SFT samples
REPRO = '{"exit_code": 1, "output": "Traceback (most recent call last):\\nAssertionError"}'


def test_sft_weights_are_the_credit_of_the_call_that_generated_each_token() -> None:
    config = SampleBuilderConfig(kinds=["SFT"], group_size=2)
    inputs = [
        episode("ok", reward=1.0, status="SUCCEEDED", timestamp=1000),
        episode(
            "half",
            reward=0.0,
            first_command="python reproduce.py",
            first_result=REPRO,
            timestamp=1001,
            signals={"tests_passed_fraction": 0.5},
        ),  # fmt: skip
    ]
    out, _ = drive(config, inputs)
    assert [(s["sample_id"], s["kind"]) for s in out] == [("ok/SFT/c0/0-1", "SFT"), ("half/SFT/c0/0-1", "SFT")]
    ok, half = (arrays(sample) for sample in out)
    assert (ok[0], ok[1], ok[2]) == (TOKENS, MASK, [float(m) for m in MASK])
    # call 0 reproduced the bug: 1.0 x progress factor 0.75; call 1 (submit) earns nothing; mask stays on both
    assert (half[1], half[2]) == (MASK, [0, 0, 0, 0.75, 0.75, 0, 0, 0, 0, 0])


def test_sft_on_successful_demonstrations_only() -> None:
    inputs = [episode("ok", reward=1.0, status="SUCCEEDED", timestamp=1000),
              episode("bad", reward=0.0, first_command="python x.py", first_result=REPRO, timestamp=1001)]  # fmt: skip
    config = SampleBuilderConfig(kinds=["RL", "SFT"], group_size=2, sft_successful_only=True)
    out, _ = drive(config, inputs)
    assert [s["sample_id"] for s in out] == ["ok/RL/c0/0-1", "ok/SFT/c0/0-1", "bad/RL/c0/0-1"]
    config = SampleBuilderConfig(kinds=["SFT"], group_size=2, sft_min_reward=0.5, credit=CreditConfig())
    assert [s["sample_id"] for s in drive(config, inputs)[0]] == ["ok/SFT/c0/0-1"]


# ----------------------------------------------------------------------------------------------- the stream
def _stream() -> list[Input | int]:
    return [
        episode("a0", reward=1.0, group="A", timestamp=1000),
        score("a0", "prm", 0, 0.5, 1001),
        episode("b0", reward=0.2, group="B", timestamp=1002),
        episode("bad", reward=1.0, group="A", timestamp=1003, complete=False),
        episode("a1", reward=0.0, group="A", timestamp=1004, first_command="python r.py", first_result=REPRO),
        score("b0", "prm", 1, -0.5, 1005),
        score("a1", "prm", 0, 1.0, 1006),
        episode("a0", reward=1.0, group="A", timestamp=1007),  # a re-delivery
        episode("b1", reward=0.7, group="B", timestamp=1008),
        score("b1", "prm", 0, 0.0, 1009),
        episode("c0", reward=0.3, group="C", timestamp=1010),
        score("c0", "prm", 0, 1.0, 1011),
        20_000,  # group C times out
    ]


STREAM_CONFIG = SampleBuilderConfig(
    kinds=["RL", "SFT"], group_size=2, group_timeout_ms=10_000, scorers={"prm": 0.1}, score_wait_ms=5000,
    score_settle_ms=1, credit=CreditConfig(score_credit={"prm": 0.4}),
)  # fmt: skip


def test_incomplete_and_duplicate_trajectories_are_counted_not_trained_on() -> None:
    out, builder = drive(STREAM_CONFIG, _stream())
    assert sorted({s["episode_id"] for s in out}) == ["a0", "a1", "b0", "b1", "c0"]
    assert (builder.stats["incomplete"], builder.stats["duplicate"], builder.stats["groups"]) == (1, 1, 3)
    assert len({s["sample_id"] for s in out}) == len(out)


def test_a_restart_over_the_same_state_store_gives_exactly_the_same_output() -> None:
    stream = _stream()
    expected, _ = drive(STREAM_CONFIG, stream)
    for restart_after in ([0], [3, 5], list(range(len(stream)))):
        store = DictStore()
        out, _ = drive(STREAM_CONFIG, stream, restart_after=restart_after, store=store)
        assert out == expected
        assert store.data.keys() <= {"clock"} | {f"done/{e}" for e in ("a0", "a1", "b0", "b1", "c0")}


def test_sample_ids_are_stable_across_runs_and_name_their_source() -> None:
    first = [s["sample_id"] for s in drive(STREAM_CONFIG, _stream())[0]]
    second = [s["sample_id"] for s in drive(STREAM_CONFIG, _stream())[0]]
    assert first == second
    assert first[:4] == ["a0/RL/c0/0-1", "a0/SFT/c0/0-1", "a1/RL/c0/0-1", "a1/SFT/c0/0-1"]


def test_emitted_episodes_are_forgotten_after_the_dedupe_window_and_late_scores_dropped() -> None:
    config = SampleBuilderConfig(
        group_size=1, dedupe_window_ms=1000, emit_zero_samples=True, scorers={"s": 1.0}, score_settle_ms=5
    )
    inputs = [episode("e", reward=1.0, timestamp=0), score("e", "s", 0, 1.0, 10), score("e", "s", 1, 1.0, 100)]
    store = DictStore()
    out, builder = drive(config, inputs, store=store)
    assert len(out) == 1 and builder.stats["scores_late"] == 1 and "done/e" in store.data
    drive(config, [2000], store=store)
    assert set(store.data) == {"clock"}


def test_records_of_other_schemas_or_unreadable_ones_are_rejected() -> None:
    builder = SampleBuilder(SampleBuilderConfig())
    builder.open(DictStore())
    with pytest.raises(RecordRejected, match="not ModelCall"):
        builder.process(Input("model-calls", "ModelCall", {}, None, 0, 0, 0), lambda *a, **k: None)
    broken = Input("trajectories", "Trajectory", {"calls": [b"junk"], "outcome": None}, None, 0, 0, 0)
    with pytest.raises(RecordRejected, match="unreadable Trajectory record"):
        builder.process(broken, lambda *a, **k: None)


def test_config_refuses_unknown_fields_and_non_finite_weights() -> None:
    with pytest.raises(ValueError, match="extra"):
        SampleBuilderConfig(group_sise=3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="finite"):
        SampleBuilderConfig(scorers={"prm": math.inf})
    assert SampleBuilderConfig(scorers={"a": 1.0}, credit=CreditConfig(score_credit={"b": 1})).awaited_scorers == (
        "a", "b",
    )  # fmt: skip


def test_held_out_evaluation_episodes_are_never_trained_on() -> None:
    inputs = [
        episode("t0", reward=1.0, group="A", timestamp=1000),
        episode("t1", reward=0.0, group="A", timestamp=1001),
        episode("e0", reward=1.0, group="eval-sft-task-3", timestamp=1002),
    ]
    out, builder = drive(SampleBuilderConfig(kinds=["RL"], group_size=2, group_timeout_ms=10), [*inputs, 50_000])
    assert sorted({s["episode_id"] for s in out}) == ["t0", "t1"]
    assert builder.stats["evaluation"] == 1


def test_an_rl_only_builder_reads_only_tokens_and_an_sft_builder_after_it_skips_what_it_left_waiting() -> None:
    rl, sft = SampleBuilderConfig(group_size=2), SampleBuilderConfig(kinds=["RL", "SFT"], group_size=2)
    store = DictStore()
    drive(rl, [episode("e1", reward=1.0, status="SUCCEEDED")], store=store)
    assert PreparedTrajectory.from_bytes(store.data["traj/e1"]).facts is None
    out, builder = drive(sft, [episode("e2", reward=0.0)], store=store)
    assert ([s["kind"] for s in out], builder.stats["SFT_no_facts"]) == (["RL", "RL", "SFT"], 1)


def test_a_trajectory_read_for_its_tokens_only_has_the_same_tokens_and_is_refused_for_the_same_reasons() -> None:
    record = dict(episode("e", reward=1.0).record)
    full, lean = trajectory_from_record(record), trajectory_from_record(record, messages=False)
    assert [s.request_messages for s in lean.steps] == [[], []] and lean.status == full.status
    for a, b in zip(full.steps, lean.steps, strict=True):
        assert (a.prompt_token_ids.tolist(), a.completion_token_ids.tolist(), a.response_tool_calls) == (
            b.prompt_token_ids.tolist(), b.completion_token_ids.tolist(), b.response_tool_calls
        )  # fmt: skip
    calls = [CODEC.decode(call).record for call in record["calls"]]
    unreadable, bad_prefix, not_a_list = (
        {"request_messages_json": "{"},
        {"request_messages_prefix_count": 9},
        {"request_messages_json": "1"},
    )
    for broken in (unreadable, bad_prefix, not_a_list):
        second = CODEC.encode("ModelCall", {**calls[1], **broken})
        bad = {**record, "calls": [CODEC.encode("ModelCall", calls[0]), second]}
        errors = []
        for messages in (True, False):
            with pytest.raises(Exception) as caught:  # noqa: PT011 - the same error either way is the point
                trajectory_from_record(bad, messages=messages)
            errors.append((type(caught.value), str(caught.value)))
        assert errors[0] == errors[1]
