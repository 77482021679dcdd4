"""The cost of an evaluation: calls and episode times summed from outcomes, tokens counted from the evaluation
episodes' ModelCall records on the bus (only the wanted episodes, each call once, whole prompts), never hanging."""

from __future__ import annotations

import json
import time
from typing import Any

from orchard.bus import Bus
from orchard.codec import Codec
from orchard.evaluation.cost import TokenCount, call_tokens, cost_of, read_token_counts
from orchard.tokens import pack_logprobs, pack_token_ids
from orchard.topics import MODEL_CALLS

T0 = 1_700_000_000_000


def model_call(episode_id: str, call_index: int, prompt: int, completion: int, prefix: int = 0) -> dict[str, Any]:
    """A ModelCall of ``episode_id`` with ``prompt`` new prompt tokens after ``prefix`` shared ones."""
    return {
        "run_id": "run", "episode_id": episode_id, "task_id": "t", "call_index": call_index, "harness": "builtin",
        "api_flavour": "CHAT", "model": "m", "policy_version": 1, "request_messages_json": json.dumps([]),
        "response_text": "", "finish_reason": "stop", "prompt_base_call_index": call_index - 1 if prefix else None,
        "prompt_prefix_length": prefix, "prompt_token_ids": pack_token_ids(range(prompt)),
        "completion_token_ids": pack_token_ids(range(completion)),
        "completion_logprobs": pack_logprobs([0.0] * completion),
        "latency_ms": 1.0, "timestamp": T0,
    }  # fmt: skip


def publish_calls(bus: Bus, calls: list[dict[str, Any]], *, key: str | None = None, timestamp_ms: int = T0) -> None:
    """Send ``calls`` keyed by episode id (as the proxy does), or by ``key``."""
    codec = Codec.default()
    bus.create_topic(MODEL_CALLS, exist_ok=True)
    with bus.producer() as producer:
        for call in calls:
            producer.produce(MODEL_CALLS, codec.encode("ModelCall", call), (key or call["episode_id"]).encode(),
                             timestamp_ms=timestamp_ms)  # fmt: skip


def test_cost_sums_calls_and_episode_durations_and_keeps_tokens_unknown_when_not_read() -> None:
    cost = cost_of([3, 0, 5], [1.5, 0.5, 4.0], 9.0, None)

    assert (cost.model_calls, cost.episode_time_s, cost.mean_episode_time_s, cost.wall_time_s) == (8, 6.0, 2.0, 9.0)
    assert (cost.calls_read, cost.total_tokens, cost.tokens_complete) == (None, None, False)
    assert cost_of([], [], 1.0, TokenCount()).mean_episode_time_s is None
    assert cost_of([2], [1.0], 1.0, TokenCount(1, 10, 2)).to_json() == {
        "model_calls": 2, "calls_read": 1, "prompt_tokens": 10, "completion_tokens": 2, "wall_time_s": 1.0,
        "episode_time_s": 1.0, "timed_episodes": 1, "total_tokens": 12, "mean_episode_time_s": 1.0,
        "tokens_complete": False,
    }  # fmt: skip


def test_a_prefix_delta_call_counts_its_whole_prompt() -> None:
    codec = Codec.default()
    decoded = codec.decode(codec.encode("ModelCall", model_call("e", 1, 3, 2, prefix=40))).record

    assert call_tokens(decoded) == (43, 2)


def test_tokens_of_the_wanted_episodes_are_counted_once_each_and_others_are_skipped(bus: Bus) -> None:
    publish_calls(bus, [model_call("a", 0, 10, 2), model_call("b", 0, 100, 20), model_call("a", 1, 5, 3, prefix=12)])
    publish_calls(bus, [model_call("a", 1, 5, 3, prefix=12)])  # delivered twice
    publish_calls(bus, [model_call("c", 0, 7, 1)], key="a")  # a foreign call under a wanted key: not counted

    started = time.monotonic()
    count = read_token_counts(bus, {"a": 3}, deadline=time.monotonic() + 30)  # 3 expected: reads to the end

    assert count == TokenCount(calls=2, prompt_tokens=10 + 17, completion_tokens=2 + 3)
    assert time.monotonic() - started < 5


def test_reading_stops_at_the_topic_end_when_calls_are_missing_and_at_the_deadline(bus: Bus) -> None:
    publish_calls(bus, [model_call("a", 0, 10, 2)])

    started = time.monotonic()
    partial = read_token_counts(bus, {"a": 3}, deadline=time.monotonic() + 30)
    assert time.monotonic() - started < 5  # the topic's end, not the deadline
    assert partial == TokenCount(calls=1, prompt_tokens=10, completion_tokens=2)
    assert read_token_counts(bus, {"a": 3}, deadline=time.monotonic()) == TokenCount()
    assert read_token_counts(bus, {}, deadline=time.monotonic() + 30) == TokenCount()


def test_no_calls_topic_means_no_tokens(bus: Bus) -> None:
    assert read_token_counts(bus, {"a": 1}, deadline=time.monotonic() + 30) == TokenCount()


def test_reading_starts_shortly_before_the_earliest_episode_start(bus: Bus) -> None:
    publish_calls(bus, [model_call("a", 0, 10, 2)], timestamp_ms=T0)
    publish_calls(bus, [model_call("a", 1, 1, 1)], timestamp_ms=T0 + 3_600_000)

    count = read_token_counts(bus, {"a": 2}, deadline=time.monotonic() + 30, since_ms=T0 + 3_600_000)

    assert count == TokenCount(calls=1, prompt_tokens=1, completion_tokens=1)  # an hour earlier: not read
